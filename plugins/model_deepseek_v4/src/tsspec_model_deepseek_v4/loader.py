"""Loading a ``DeepseekV4Target`` from a GGUF file (the registered loader) or from memory.

``dtype`` ``"float64"`` gives a model whose multi-row verify and one-row decode agree to ~1e-15
(the lossless tests use it); the default is float32.
"""

from __future__ import annotations

from typing import Any

from tsspec_gguf.cpu_dtype import cpu_load_dtype, resolve_dtype

from .hparams import DeepseekV4HParams
from .target import DeepseekV4Target
from .weights import load_weights

OWNER = "tsspec-model-deepseek-v4"


def load_from_source(source: Any, *, dtype: Any = None, tokenizer=None, max_context: int | None = None,
                     with_draft_head: bool = True) -> DeepseekV4Target:
    """A target from an open ``GGUFFile`` or a ``MemorySource``."""
    torch_dtype = resolve_dtype(dtype, OWNER)
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

    dtype = cpu_load_dtype(gguf_path, options, OWNER)
    with GGUFFile(gguf_path) as gf:
        tokenizer = tokenizer_from_gguf(gf)
        return load_from_source(gf, dtype=dtype, tokenizer=tokenizer)
