"""A GGUF file opened for loading: typed metadata, tensor descriptors, dequantised tensors.

Every failure, whatever its cause (no such file, not a GGUF, a truncated or corrupted header, a
missing key or tensor, a wrong shape), surfaces as ``ModelLoadError(path, problem)`` with a
one-line problem, so the CLI can print ``tsspec: error: <file>: <problem>`` and exit 2.

The file is memory-mapped; tensor bytes are read only when a tensor is asked for::

    gf = GGUFFile("model.gguf")
    gf.architecture                       # "llama"
    gf.require(gf.arch_key("block_count"), int)   # 30
    gf.tensor_shape("token_embd.weight")  # (49152, 576): numpy order
    w = gf.tensor("blk.0.attn_q.weight")  # torch.float32 [576, 576], dequantised
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tsspec.errors import ModelLoadError
from .gguf_header import GGUFHeader, HeaderError, TensorInfo, parse_header

__all__ = ["GGUFFile", "MISSING", "MEMORY_PATH", "MemorySource", "read_architecture"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # "no default": get() raises like require() when the key is absent
_DECODE_ERRORS = (struct.error, ValueError, OverflowError, IndexError, KeyError, MemoryError)

_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "a boolean", list: "an array"}


def _python_value(value: Any) -> Any:
    """Metadata as plain python: numpy arrays (scalar arrays) become lists."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        if value and isinstance(value[0], str):  # string arrays (vocabularies) hold only str
            return list(value)
        return [_python_value(v) for v in value]
    return value


def _matches(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is list:
        return isinstance(value, (list, np.ndarray))
    return isinstance(value, kind)


class GGUFFile:
    """One memory-mapped GGUF. Cheap to open: only the header is parsed."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = str(path)
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            raise ModelLoadError(self.path, "no such file") from None
        except OSError as exc:
            raise ModelLoadError(self.path, f"cannot read the file ({exc.strerror or exc})") from None
        if not Path(self.path).is_file():
            raise ModelLoadError(self.path, "not a regular file")
        if stat.st_size == 0:
            raise ModelLoadError(self.path, "the file is empty (not a GGUF file)")
        self.file_size = int(stat.st_size)
        self.mtime_ns = int(stat.st_mtime_ns)
        try:
            with open(self.path, "rb") as handle:
                self._mmap = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(self.path, f"cannot map the file ({exc})") from None
        try:
            self._header: GGUFHeader = parse_header(self._mmap, self.file_size)
        except HeaderError as exc:
            self.close()
            raise ModelLoadError(self.path, str(exc)) from None
        except _DECODE_ERRORS as exc:  # defensive: any decoding slip is still one line
            self.close()
            raise ModelLoadError(self.path, f"corrupted header ({type(exc).__name__}: {exc})") from None

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Release the mapping. Tensors already returned are copies and stay valid."""
        mapped = getattr(self, "_mmap", None)
        if mapped is not None:
            try:
                mapped.close()
            except BufferError:  # a numpy view still references it; the GC will release it
                pass
            self._mmap = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, arch={self.get('general.architecture', None)!r})"

    # -- metadata --------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._header.version

    @property
    def keys(self) -> list[str]:
        return list(self._header.metadata)

    def __contains__(self, key: str) -> bool:
        return key in self._header.metadata

    @property
    def architecture(self) -> str:
        return self.require("general.architecture", str)

    def arch_key(self, suffix: str) -> str:
        """``{architecture}.{suffix}``, the spelling of per-architecture keys."""
        return f"{self.architecture}.{suffix}"

    def get(self, key: str, default: Any = MISSING) -> Any:
        """The value of ``key`` as python (str, int, float, bool or list); ``default`` when it is
        absent, or ModelLoadError when no default is given."""
        if key in self._header.metadata:
            return _python_value(self._header.metadata[key])
        if default is MISSING:
            raise ModelLoadError(self.path, f"missing metadata key {key!r}")
        return default

    def require(self, key: str, kind: type | None = None) -> Any:
        """The value of ``key``; ModelLoadError naming the key when absent or not of ``kind``."""
        value = self.get(key)
        if kind is not None and not _matches(value, kind):
            raise ModelLoadError(
                self.path, f"metadata key {key!r} should be {_KIND_NAMES.get(kind, kind.__name__)}, "
                f"got {type(value).__name__}"
            )
        return value

    def get_array(self, key: str, default: Any = MISSING) -> np.ndarray | Any:
        """A scalar array as numpy (no per-item python objects: scores, token types)."""
        if key not in self._header.metadata:
            if default is MISSING:
                raise ModelLoadError(self.path, f"missing metadata key {key!r}")
            return default
        value = self._header.metadata[key]
        if not isinstance(value, np.ndarray):
            raise ModelLoadError(self.path, f"metadata key {key!r} is not a numeric array")
        return value

    # -- tensors ---------------------------------------------------------------------------
    @property
    def tensor_names(self) -> list[str]:
        return list(self._header.tensors)

    def has_tensor(self, name: str) -> bool:
        return name in self._header.tensors

    def tensor_info(self, name: str) -> TensorInfo:
        info = self._header.tensors.get(name)
        if info is None:
            raise ModelLoadError(self.path, f"missing tensor {name!r}")
        return info

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Shape in numpy order (ggml's dims reversed): a linear weight is [out, in]."""
        return self.tensor_info(name).shape

    def check_tensor(self, name: str, shape: Sequence[int] | None = None) -> tuple[int, ...]:
        """Presence (and shape, when given) of a tensor without reading it."""
        actual = self.tensor_shape(name)
        if shape is not None and tuple(actual) != tuple(int(s) for s in shape):
            raise ModelLoadError(
                self.path, f"tensor {name!r} has shape {list(actual)}, expected {list(shape)}"
            )
        return actual

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The raw bytes of a tensor as a read-only uint8 view of the mapping."""
        info = self.tensor_info(name)
        if self._mmap is None:
            raise ModelLoadError(self.path, "the file was closed")
        return np.frombuffer(self._mmap, dtype=np.uint8, count=info.n_bytes, offset=info.offset)

    def tensor(self, name: str, dtype=None):
        """The tensor dequantised to a torch tensor of ``dtype`` (float32 by default), shaped
        in numpy order."""
        import torch

        from .dequant import UnsupportedType, dequantize

        info = self.tensor_info(name)
        try:
            return dequantize(
                self.tensor_bytes(name), info.ggml_type, info.shape, dtype or torch.float32
            )
        except UnsupportedType as exc:
            raise ModelLoadError(self.path, f"tensor {name!r}: {exc}") from None

    def require_tensor(self, name: str, shape: Sequence[int] | None = None, dtype=None):
        """``check_tensor`` then ``tensor``."""
        self.check_tensor(name, shape)
        return self.tensor(name, dtype)


def read_architecture(path: str | os.PathLike[str]) -> str:
    """``general.architecture`` of a GGUF (ModelLoadError if it is not a readable GGUF)."""
    with GGUFFile(path) as gguf_file:
        return gguf_file.architecture


MEMORY_PATH = "<memory>"


class MemorySource:
    """An in-memory stand-in for ``GGUFFile``: the reading methods a loader uses
    (``architecture``, ``arch_key``, ``get``, ``require``, ``tensor_names``, ``has_tensor``,
    ``tensor_shape``, ``tensor``, ``require_tensor``, ``close``) over dicts, so a converter's
    output (tests, a benchmark's random model) loads through exactly the code path a file takes.

    ``metadata`` uses full GGUF key names (``qwen35.block_count``); ``tensors`` are in numpy
    order (a linear weight is [out, in]), as numpy arrays or torch tensors. ``require`` does not
    check the value's kind. Failures are ``ModelLoadError``s naming ``path``.
    """

    def __init__(self, architecture: str, metadata: Any, tensors: Any, path: str = MEMORY_PATH):
        self.path = path
        self._metadata = {"general.architecture": architecture, **dict(metadata)}
        self._tensors = dict(tensors)

    @property
    def architecture(self) -> str:
        return self._metadata["general.architecture"]

    def arch_key(self, suffix: str) -> str:
        return f"{self.architecture}.{suffix}"

    def get(self, key: str, default: Any = MISSING) -> Any:
        if key in self._metadata:
            value = self._metadata[key]
            return value.tolist() if isinstance(value, np.ndarray) else value
        if default is MISSING:
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

    def tensor(self, name: str, dtype=None):
        """The tensor as torch (``dtype``, default float32), numpy order."""
        import torch

        if name not in self._tensors:
            raise ModelLoadError(self.path, f"missing tensor {name!r}")
        value = self._tensors[name]
        out = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
        return out.to(dtype or torch.float32)

    def require_tensor(self, name: str, shape: Sequence[int] | None = None, dtype=None):
        actual = self.tensor_shape(name)
        if shape is not None and tuple(actual) != tuple(int(s) for s in shape):
            raise ModelLoadError(self.path, f"tensor {name!r} has shape {list(actual)}, expected {list(shape)}")
        return self.tensor(name, dtype)

    def close(self) -> None:
        pass
