"""Loading a ``GlmDsaTarget`` from a GGUF file (the registered loader) or from memory.

The NextN layer is read only when draft-head speculation is requested at load time
(``request.read_request``: ``TS_MTP_SPEC`` / ``TS_MTP_TYPE`` / ``TS_MTP_DRAFT`` and their
``TS_SPEC_*`` spellings, over the loader's options); otherwise none of its tensors is touched
and the target says why it carries no head. ``dtype`` ``"float64"`` is the exact reference
mode; the default is float32.
"""

from __future__ import annotations

from typing import Any

from tsspec_gguf.cpu_dtype import cpu_load_dtype, resolve_dtype

from .hparams import GlmDsaHParams
from .request import NextNRequest, read_request
from .target import GlmDsaTarget
from .weights import has_nextn, load_nextn, load_trunk

OWNER = "tsspec-model-glm-dsa"


def load_from_source(source: Any, *, dtype: Any = None, tokenizer=None, max_context: int | None = None,
                     request: NextNRequest | None = None) -> GlmDsaTarget:
    """A target from an open ``GGUFFile`` or a ``MemorySource``; ``request`` None reads it now."""
    torch_dtype = resolve_dtype(dtype, OWNER)
    hp = GlmDsaHParams.from_gguf(source)
    request = request or read_request()
    weights = load_trunk(source, hp, torch_dtype)
    target = GlmDsaTarget(hp, weights, dtype=torch_dtype, tokenizer=tokenizer, max_context=max_context,
                          source_path=getattr(source, "path", None))
    if not has_nextn(source, hp):
        target.spec_draft_head_absence = "the file carries no NextN layer (nextn_predict_layers "
        target.spec_draft_head_absence += f"{hp.nextn_layers}, no blk.{hp.num_layers}.nextn.* tensors)"
    elif not request.wanted:
        target.spec_draft_head_absence = (f"the file's NextN layer was not loaded: {request.reason}; "
                                          "reload with draft-head speculation on to use it")
    else:
        from .nextn import NextNHead

        nextn = load_nextn(source, hp, weights.final_norm, torch_dtype)
        target.draft_head = NextNHead(target.trunk, nextn, target.max_context_length)
    return target


def load_glm_dsa(gguf_path: str, options: Any = None) -> GlmDsaTarget:
    """The registered loader: ``loader(gguf_path, options) -> SpeculativeTarget``."""
    from tsspec_gguf.gguf_file import GGUFFile
    from tsspec_gguf.tokenizer import from_gguf as tokenizer_from_gguf

    dtype = cpu_load_dtype(gguf_path, options, OWNER)
    request = read_request(options)
    with GGUFFile(gguf_path) as gf:
        tokenizer = tokenizer_from_gguf(gf)
        return load_from_source(gf, dtype=dtype, tokenizer=tokenizer, request=request)
