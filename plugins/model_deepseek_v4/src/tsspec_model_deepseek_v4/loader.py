"""Loading a ``DeepseekV4Target`` from a GGUF file (the registered loader) or from memory.

``dtype`` ``"float64"`` gives a model whose multi-row verify and one-row decode agree to ~1e-15
(the lossless tests use it); the default is float32.
"""

from __future__ import annotations

from typing import Any

import torch

from tsspec.errors import ModelLoadError

from .hparams import DeepseekV4HParams
from .target import DeepseekV4Target
from .weights import load_weights

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64, "fp64": torch.float64}


def resolve_dtype(value: Any) -> torch.dtype:
    if value is None or value == "auto":
        return torch.float32
    if isinstance(value, torch.dtype):
        return value
    text = str(value).replace("torch.", "").lower()
    if text not in DTYPES:
        raise ValueError(f"dtype {value!r} is not supported by tsspec-model-deepseek-v4 (use float32 or float64)")
    return DTYPES[text]


def load_from_source(source: Any, *, dtype: Any = None, tokenizer=None, max_context: int | None = None,
                     with_draft_head: bool = True) -> DeepseekV4Target:
    """A target from an open ``GGUFFile`` or a ``MemorySource``."""
    torch_dtype = resolve_dtype(dtype)
    hp = DeepseekV4HParams.from_gguf(source)
    weights = load_weights(source, hp, torch_dtype, with_mtp=with_draft_head)
    target = DeepseekV4Target(hp, weights, dtype=torch_dtype, tokenizer=tokenizer, max_context=max_context,
                              with_draft_head=with_draft_head, source_path=getattr(source, "path", None))
    if with_draft_head and target.draft_head is None:
        from .dspark import attach_embedded_dspark

        attach_embedded_dspark(target, source, torch_dtype)
    return target


def load_deepseek_v4(gguf_path: str, options: Any = None) -> DeepseekV4Target:
    """The registered loader: ``loader(gguf_path, options) -> SpeculativeTarget``."""
    from tsspec_gguf.gguf_file import GGUFFile
    from tsspec_gguf.tokenizer import from_gguf as tokenizer_from_gguf

    device = getattr(options, "device", "cpu") or "cpu"
    if device != "cpu":
        raise ModelLoadError(gguf_path, f"tsspec-model-deepseek-v4 runs on the CPU only (asked for {device!r})")
    try:
        dtype = resolve_dtype(getattr(options, "dtype", None))
    except ValueError as exc:
        raise ModelLoadError(gguf_path, str(exc)) from None
    with GGUFFile(gguf_path) as gf:
        tokenizer = tokenizer_from_gguf(gf)
        return load_from_source(gf, dtype=dtype, tokenizer=tokenizer)
