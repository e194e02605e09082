"""Reading a Hugging Face checkpoint directory for a converter, and the matrices' output type.

``read_checkpoint(src)`` -> (config.json as a dict, the safetensors shards' state dict);
``quantised(tensors, outtype)`` -> the tensors as ``write_gguf`` takes them (``f32`` as they are,
``f16`` float16 arrays, ``q8_0`` gguf's quantiser where the row length allows; only float32
matrices change). Every failure is a ``ConversionError``: one line naming the source.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tsspec.errors import TsspecError

OUT_TYPES = ("f32", "f16", "q8_0")


class ConversionError(TsspecError):
    """A checkpoint that cannot be converted; one line naming the source and the problem."""

    def __init__(self, source: str, problem: str):
        super().__init__(f"{source}: {problem}")


def read_checkpoint(src_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config, state dict) of an HF directory; ConversionError for anything unreadable."""
    root = Path(src_dir)
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConversionError(str(root), f"config.json is unreadable ({exc})") from None
    shards = sorted(root.glob("*.safetensors"))
    if not shards:
        raise ConversionError(str(root), "no *.safetensors files")
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ConversionError(str(root), "reading HF checkpoints needs 'safetensors' (pip install safetensors)") from None
    state: dict[str, Any] = {}
    for shard in shards:
        try:
            state.update(load_file(str(shard)))
        except Exception as exc:
            raise ConversionError(str(root), f"{shard.name}: {exc}") from None
    return config, state


def quantised(tensors: Mapping[str, np.ndarray], outtype: str) -> dict[str, Any]:
    """2-D float32 weights as ``outtype``; vectors and other dtypes as they are."""
    from gguf import GGMLQuantizationType

    if outtype not in OUT_TYPES:
        raise ConversionError("--outtype", f"{outtype!r} is not one of {', '.join(OUT_TYPES)}")
    out: dict[str, Any] = {}
    for name, array in tensors.items():
        if array.ndim != 2 or outtype == "f32" or array.dtype != np.float32:
            out[name] = array
        elif outtype == "f16":
            out[name] = array.astype(np.float16)
        else:
            out[name] = (array, GGMLQuantizationType.Q8_0) if array.shape[1] % 32 == 0 else array
    return out
