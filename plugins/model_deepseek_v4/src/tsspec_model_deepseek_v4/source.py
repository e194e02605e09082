"""An in-memory stand-in for ``tsspec.modeling.gguf_file.GGUFFile``.

The loader reads weights through the handful of methods GGUFFile offers (``architecture``,
``arch_key``, ``get``, ``has_tensor``, ``tensor_shape``, ``tensor``, ``require_tensor``). The same
methods over a dict let the converter's output be loaded without a file (tests, the benchmark's
random model) through exactly the code path a GGUF file takes.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from tsspec.errors import ModelLoadError

MEMORY_PATH = "<memory>"
_MISSING = object()


class MemorySource:
    """``metadata`` uses full GGUF key names (``deepseek4.block_count``); ``tensors`` are in numpy
    order (a linear weight is [out, in]), as numpy arrays or torch tensors."""

    def __init__(self, architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, Any],
                 path: str = MEMORY_PATH):
        self.path = path
        self._metadata = {"general.architecture": architecture, **dict(metadata)}
        self._tensors = dict(tensors)

    @property
    def architecture(self) -> str:
        return self._metadata["general.architecture"]

    def arch_key(self, suffix: str) -> str:
        return f"{self.architecture}.{suffix}"

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key in self._metadata:
            value = self._metadata[key]
            return value.tolist() if isinstance(value, np.ndarray) else value
        if default is _MISSING:
            raise ModelLoadError(self.path, f"missing metadata key {key!r}")
        return default

    def require(self, key: str, kind: type | None = None) -> Any:
        return self.get(key)

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        if name not in self._tensors:
            raise ModelLoadError(self.path, f"missing tensor {name!r}")
        return tuple(int(s) for s in self._tensors[name].shape)

    def tensor(self, name: str, dtype=None) -> torch.Tensor:
        if name not in self._tensors:
            raise ModelLoadError(self.path, f"missing tensor {name!r}")
        value = self._tensors[name]
        out = torch.as_tensor(np.asarray(value)) if not isinstance(value, torch.Tensor) else value
        return out.to(dtype or torch.float32)

    def require_tensor(self, name: str, shape: Sequence[int] | None = None, dtype=None) -> torch.Tensor:
        actual = self.tensor_shape(name)
        if shape is not None and tuple(actual) != tuple(int(s) for s in shape):
            raise ModelLoadError(self.path, f"tensor {name!r} has shape {list(actual)}, expected {list(shape)}")
        return self.tensor(name, dtype)

    def close(self) -> None:
        pass
