"""``load_gemma4(gguf_path, options)``: the loader registered for ``gemma4`` files.

Dtype: float32 (default; CPU, matrices on the compiled block kernels when they are built, the
file's quantised blocks kept) or float64 (the exact reference mode for tests, dense torch).
CPU only. ``--dtype float32`` asks for dense float32 matrices (one row at a time).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf import native
from tsspec_gguf.gguf_file import GGUFFile
from tsspec_gguf.tokenizer import from_gguf

from .hparams import ARCH, read_hparams
from .rows import Linear
from .target import Gemma4Target
from .weights import check_layer_count, layer_weights, rope_factors

log = logging.getLogger("tsspec.gemma4")
SUPPORTED_TOKENIZERS = ("gpt2", "llama")  # what tsspec_gguf.tokenizer.from_gguf reads
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
          "float64": torch.float64, "fp64": torch.float64}


def setting(options: Any, name: str) -> Any:
    if options is None:
        return None
    if isinstance(options, Mapping):
        return options.get(name)
    return getattr(options, name, None)


def resolve_dtype(path: str, options: Any) -> tuple[torch.dtype, bool]:
    """(dtype, blocks) from ``--device`` / ``--dtype``; ModelLoadError for what is not served."""
    device = str(setting(options, "device") or "cpu")
    if device != "cpu":
        raise ModelLoadError(path, f"--device {device}: the gemma4 plugin runs on the cpu")
    requested = setting(options, "dtype")
    if requested in (None, "auto"):
        if not native.available():
            native.warn_fallback(path)
        return torch.float32, native.available()
    dtype = DTYPES.get(str(requested).lower().removeprefix("torch."))
    if dtype is None:
        raise ModelLoadError(path, f"--dtype {requested!r} is not supported (use float32 or float64)")
    return dtype, False


def load_gemma4(gguf_path: str | os.PathLike[str], options: Any = None) -> Gemma4Target:
    """Open, check and load a Gemma 4 GGUF. Every problem is a ModelLoadError."""
    path = os.fspath(gguf_path)
    dtype, blocks = resolve_dtype(path, options)
    vdtype = torch.float64 if dtype == torch.float64 else torch.float32
    with GGUFFile(path) as gf:
        if gf.architecture != ARCH:
            raise ModelLoadError(path, f"architecture {gf.architecture!r} is not {ARCH!r}")
        hp = read_hparams(gf)
        check_layer_count(hp, gf)
        H, V = hp.hidden_size, hp.vocab_size
        gf.check_tensor("token_embd.weight", (V, H))
        embed = gf.tensor("token_embd.weight").to(vdtype).contiguous()
        head_name = "output.weight" if gf.has_tensor("output.weight") else None
        weights: dict = {
            "embed": embed,
            "lm_head": Linear(gf, [head_name], dtype, blocks) if head_name else Linear(gf, [], dtype, blocks, dense=embed),
            "output_norm": gf.tensor("output_norm.weight").to(vdtype).reshape(H),
            "layers": [layer_weights(hp, gf, i, dtype, blocks, vdtype) for i in range(hp.n_layers)],
            "rope_factors": rope_factors(hp, gf),
        }
        if hp.ple_dim:
            LP = hp.n_layers * hp.ple_dim
            gf.check_tensor("per_layer_token_embd.weight")
            weights["ple_embed"] = gf.tensor("per_layer_token_embd.weight").to(vdtype).reshape(-1, LP)
            gf.check_tensor("per_layer_model_proj.weight", (LP, H))
            weights["ple_proj"] = Linear(gf, ["per_layer_model_proj.weight"], dtype, blocks)
            weights["ple_norm"] = gf.tensor("per_layer_proj_norm.weight").to(vdtype).reshape(hp.ple_dim)
        tokenizer = _tokenizer(gf)
        return Gemma4Target(hp, weights, tokenizer=tokenizer, dtype=dtype, path=path)


def _tokenizer(gf):
    """The file's tokenizer; None, with a one-line warning, for a vocabulary type the toolkit
    does not read (llama.cpp writes Gemma 4's as ``gemma4``, a BPE over SentencePiece-escaped
    text): the model then takes token ids (the Python API), and the CLI says it has no tokenizer."""
    kind = gf.get("tokenizer.ggml.model", None)
    if kind is not None and kind not in SUPPORTED_TOKENIZERS and gf.get("tokenizer.ggml.tokens", None):
        log.warning("%s: tokenizer model %r is not supported (supported: %s); loaded for token ids only",
                    gf.path, kind, ", ".join(SUPPORTED_TOKENIZERS))
        return None
    return from_gguf(gf)
