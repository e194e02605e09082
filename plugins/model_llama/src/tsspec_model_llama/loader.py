"""``load_llama(gguf_path, options)``: the loader this plugin registers for ``llama`` files.

``options`` is what ``tsspec.load_model`` passes (``LoadOptions`` with ``device`` and ``dtype``);
a mapping or None work too. Device: ``cpu`` (default) or ``cuda[:N]`` where torch has CUDA.
Dtype: ``float32`` (default), ``bfloat16`` or ``float16``. On the CPU with the compiled kernels,
``bfloat16`` / ``float16`` keep every matrix at 16 bits and multiply on the row-invariant kernel
in float32 math (``tsspec_gguf.qlinear``'s formats F16 / BF16: each weight widened exactly), so
verify rows equal one-row decodes bit for bit; elsewhere (``--device cuda``, no kernels) the
matmuls run in torch in that dtype, and the residual stream, norms and RoPE stay float32.

Weights: with no ``--dtype`` on the CPU (the default), Q4_0 / Q4_1 / Q8_0 matrices stay in their
quantised blocks and the compiled block kernel multiplies on them in float32 math
(``tsspec_gguf.qlinear``): 4-6x fewer bytes per decode step, the same values as the
dequantised matrix, and batch-invariant rows. ``--dtype float32`` asks for dense float32 weights
(torch GEMMs); so does a build without the compiled kernel. ``--dtype int8`` keeps the blocks
and quantises activations to int8 per 32 values (llama.cpp's arithmetic, exact integer dots);
``--dtype float32-blocks`` keeps the blocks with float32 math. The default arithmetic is
``DEFAULT_PRECISION``, chosen from measured fidelity (scripts/precision_study.py). ``float64`` runs everything in double
precision: slow, but multi-row and one-row forwards then agree to ~1e-15 (exact-output tests).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Mapping

import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf.cache import WeightCache
from tsspec_gguf.gguf_file import GGUFFile
from tsspec_gguf import native
from tsspec_gguf.tokenizer import from_gguf

from .chat_templates import use_builtin_chat_template
from .hparams import read_hparams
from .target import LlamaTarget
from .weights import HALF_FORMATS, SERVED_KEY, load_weights
from . import ARCHITECTURES

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16, "half": torch.float16,
    "float64": torch.float64, "fp64": torch.float64,  # the exact reference mode for tests
}
DEFAULT_DTYPE = torch.float32
# --dtype values that keep the file's quantised blocks on the compiled CPU kernel, and the
# kernel's arithmetic each asks for (tsspec_gguf.qlinear.PRECISIONS)
BLOCK_DTYPES = {"int8": "int8", "q8": "int8", "float32-blocks": "float32", "blocks": "float32"}
# the arithmetic of the default (no --dtype) CPU path, chosen from the measured fidelity of int8
# activations against the float32 path (scripts/precision_study.py: logit error, greedy agreement)
DEFAULT_PRECISION = "float32"


def _setting(options: Any, name: str) -> Any:
    if options is None:
        return None
    if isinstance(options, Mapping):
        return options.get(name)
    try:
        value = getattr(options, name)
    except AttributeError:
        value = None
    if value is None:  # a SpeculationOptions carries plugin settings in ``extra``
        try:
            extra = getattr(options, "extra")
        except AttributeError:
            extra = None
        if isinstance(extra, Mapping):
            value = extra.get(name)
    return value


def resolve_dtype(path: str, value: Any) -> torch.dtype:
    if value is None or value == "auto":
        return DEFAULT_DTYPE
    if isinstance(value, torch.dtype):
        return value
    dtype = DTYPES.get(str(value).lower())
    if dtype is None:
        raise ModelLoadError(path, f"--dtype {value!r} is not supported (use {', '.join(sorted(set(DTYPES) | set(BLOCK_DTYPES)))})")
    return dtype


def resolve_device(path: str, value: Any) -> torch.device:
    text = str(value or "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ModelLoadError(path, f"--device {text!r} is not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(path, f"--device {text}: torch has no CUDA device here")
    return device


def warn_dense_matrices(path: str, served: Mapping[str, tuple[int, int]]) -> str | None:
    """One line on stderr naming the ggml types (and tensor counts) whose matrices run as
    float32 weights instead of blocks on the block path (F32 matrices are float32 already); None
    when every other matrix is in blocks."""
    dense = {kind: counts[1] for kind, counts in sorted(served.items()) if counts[1] and kind != "F32"}
    if not dense:
        return None
    types = ", ".join(f"{kind} x{n}" for kind, n in dense.items())
    line = (f"tsspec: warning: {path}: {sum(dense.values())} matrix tensors ({types}) have no block form here "
            "(or share a fused matrix with one) and run as float32 weights (slower)")
    print(line, file=sys.stderr)
    return line


def load_llama(gguf_path: str | os.PathLike[str], options: Any = None, *, cache: WeightCache | None = None) -> LlamaTarget:
    """Open, check and load a llama-family GGUF. Every problem is a ModelLoadError."""
    started = time.perf_counter()
    path = os.fspath(gguf_path)
    device = resolve_device(path, _setting(options, "device"))
    requested = _setting(options, "dtype")
    precision = BLOCK_DTYPES.get(str(requested).lower()) if requested is not None else None
    half = None
    if precision is None and requested is not None and device.type == "cpu" and native.available():
        half = HALF_FORMATS.get(str(resolve_dtype(path, requested)).removeprefix("torch."))
    if half is not None:  # 16-bit weights on the row-invariant kernel, float32 math
        dtype, blocks, precision = DEFAULT_DTYPE, True, DEFAULT_PRECISION
    elif precision is not None:
        if device.type != "cpu" or not native.available():
            raise ModelLoadError(path, f"--dtype {requested} runs on the compiled CPU kernels: "
                                       "use --device cpu with a build that has them")
        dtype, blocks = DEFAULT_DTYPE, True
    else:
        dtype = resolve_dtype(path, requested)
        blocks = requested in (None, "auto") and device.type == "cpu" and native.available()
        if requested in (None, "auto") and device.type == "cpu" and not blocks:
            native.warn_fallback(path)
        precision = DEFAULT_PRECISION
    with GGUFFile(path) as gguf_file:
        if gguf_file.architecture not in ARCHITECTURES:
            raise ModelLoadError(
                path, f"architecture {gguf_file.architecture!r} is not a family this plugin serves "
                      f"({', '.join(ARCHITECTURES)})"
            )
        hparams = read_hparams(gguf_file)
        weight_cache = cache if cache is not None else WeightCache()
        weights = load_weights(hparams, gguf_file, dtype, weight_cache, blocks=blocks, half=half)
        tokenizer = from_gguf(gguf_file)
    template_note = use_builtin_chat_template(tokenizer, hparams.family, path)
    if blocks:
        warn_dense_matrices(path, weights.get(SERVED_KEY) or {})
    return LlamaTarget(
        hparams,
        weights,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        path=path,
        load_seconds=time.perf_counter() - started,
        cache_hit=weight_cache.last_hit,
        precision=precision,
        chat_template_note=template_note,
    )
