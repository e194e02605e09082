"""Writing GGUF files: what converters write checkpoints with, and what tests write tiny
random ``transformers`` models with (the oracle for every model plugin), in one call::

    write_gguf(path, "llama",
               {"llama.block_count": 2, "llama.rope.freq_base": 10000.0},
               {"token_embd.weight": emb, "blk.0.attn_q.weight": (wq, GGMLQuantizationType.Q8_0)},
               tokenizer={"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [...]})

Metadata values are typed from python: bool -> BOOL, int -> UINT32 (INT32 when negative,
64-bit when out of range), float -> FLOAT32, str -> STRING, lists -> arrays of the first item's
type. ``(value, GGUFValueType)`` pins a type (``(xs, (ARRAY, INT32))`` for an array's items).
Tensors are numpy arrays in numpy order (a linear weight is [out, in]); float32 and float16
arrays are written as F32 / F16, ``(array, ggml_type)`` quantises with ``gguf.quants``.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np
from gguf import GGUFValueType, GGUFWriter, GGMLQuantizationType
from gguf import quants

__all__ = ["write_gguf"]

UINT32_MAX = 2**32 - 1
INT32_MIN = -(2**31)


def _scalar_type(value: Any) -> GGUFValueType:
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL
    if isinstance(value, (int, np.integer)):
        value = int(value)
        if 0 <= value <= UINT32_MAX:
            return GGUFValueType.UINT32
        if INT32_MIN <= value < 0:
            return GGUFValueType.INT32
        return GGUFValueType.UINT64 if value > 0 else GGUFValueType.INT64
    if isinstance(value, (float, np.floating)):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    raise TypeError(f"no GGUF type for {type(value).__name__}")


def _add_value(writer: GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], (GGUFValueType, tuple)):
        value, pinned = value
        if isinstance(pinned, tuple):  # (ARRAY, item type)
            writer.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=pinned[1])
        else:
            writer.add_key_value(key, value, pinned)
        return
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"metadata key {key!r}: GGUF arrays cannot be empty")
        items = list(value)
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
            low, high = min(items), max(items)
            sub = GGUFValueType.INT32 if INT32_MIN <= low and high < 2**31 else GGUFValueType.INT64
        else:
            sub = _scalar_type(items[0])
        writer.add_key_value(key, items, GGUFValueType.ARRAY, sub_type=sub)
        return
    writer.add_key_value(key, value, _scalar_type(value))


def _add_tensor(writer: GGUFWriter, name: str, value: Any) -> None:
    if isinstance(value, tuple):
        array, ggml_type = value
        if np.asarray(array).dtype == np.uint8 and ggml_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            # already-encoded blocks [rows, bytes per row] (e.g. K-quants, which gguf cannot encode)
            writer.add_tensor(name, np.ascontiguousarray(array), raw_dtype=ggml_type)
            return
        array = np.ascontiguousarray(array, dtype=np.float32)
        if ggml_type in (GGMLQuantizationType.F32,):
            writer.add_tensor(name, array)
        elif ggml_type == GGMLQuantizationType.F16:
            writer.add_tensor(name, array.astype(np.float16))
        else:
            packed = quants.quantize(array, ggml_type)
            writer.add_tensor(name, packed, raw_dtype=ggml_type)
        return
    array = np.ascontiguousarray(value)
    if array.dtype not in (np.float32, np.float16):
        array = array.astype(np.float32)
    writer.add_tensor(name, array)


def write_gguf(
    path: str | os.PathLike[str],
    arch: str,
    metadata: Mapping[str, Any],
    tensors: Mapping[str, Any],
    tokenizer: Mapping[str, Any] | None = None,
) -> str:
    """Write a GGUF at ``path`` (``general.architecture`` = ``arch``); returns the path."""
    writer = GGUFWriter(os.fspath(path), arch)
    try:
        for key, value in {**dict(metadata), **dict(tokenizer or {})}.items():
            _add_value(writer, key, value)
        for name, value in tensors.items():
            _add_tensor(writer, name, value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return os.fspath(path)
