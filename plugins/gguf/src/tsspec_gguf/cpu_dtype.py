"""The float dtypes a CPU-only model plugin runs, read from the loader's options.

``float32`` (the serving dtype, the default) or ``float64`` (an exact reference mode); anything
else, or a device other than the CPU, is a ``ModelLoadError`` naming the plugin.
"""

from __future__ import annotations

from typing import Any

import torch

from tsspec.errors import ModelLoadError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64, "fp64": torch.float64}


def resolve_dtype(value: Any, owner: str = "this plugin") -> torch.dtype:
    """None / ``auto`` -> float32; a torch dtype as it is; a name from ``DTYPES`` (ValueError otherwise)."""
    if value is None or value == "auto":
        return torch.float32
    if isinstance(value, torch.dtype):
        return value
    text = str(value).replace("torch.", "").lower()
    if text not in DTYPES:
        raise ValueError(f"dtype {value!r} is not supported by {owner} (use float32 or float64)")
    return DTYPES[text]


def cpu_load_dtype(gguf_path: str, options: Any, owner: str) -> torch.dtype:
    """The dtype ``options`` ask for, checking the device is the CPU; ModelLoadError otherwise."""
    device = getattr(options, "device", "cpu") or "cpu"
    if device != "cpu":
        raise ModelLoadError(gguf_path, f"{owner} runs on the CPU only (asked for {device!r})")
    try:
        return resolve_dtype(getattr(options, "dtype", None), owner)
    except ValueError as exc:
        raise ModelLoadError(gguf_path, str(exc)) from None
