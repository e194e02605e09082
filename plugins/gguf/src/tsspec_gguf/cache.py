"""A load cache of prepared (dequantised, fused) weights, so the second load takes seconds.

Dequantising and fusing a model's weights costs seconds to minutes; the result depends only on
the GGUF's bytes and on how the plugin lays the weights out. A cache entry is therefore keyed by
the file's resolved path, size and mtime, the set of its tensors (names, types, shapes), the
plugin's layout tag and the dtype. An entry is one file::

    b"TSSPECW1" | u64 header length | JSON header | padding | tensor bytes (64-byte aligned)

The JSON names each tensor with its dtype, shape and offset, and the data size, so a
truncated entry is detected; an unreadable or inconsistent entry is rebuilt. Entries are written
to a temporary file in the cache directory and renamed into place (atomic on POSIX), so a crash
or a concurrent writer never leaves a half-written entry under the final name.

On reload the tensors are read into memory (``mode="read"``, the default: ordinary anonymous
pages, so the hot loop sees no page faults and the file may be deleted) or memory-mapped
copy-on-write (``mode="mmap"``: nothing is read until used).

Location: ``$TSSPEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/tsspec``, else ``~/.cache/tsspec``.
``TSSPEC_CACHE_DIR=off`` (or ``none``, ``0``) disables the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import tempfile
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch

__all__ = ["WeightCache", "cache_dir", "cache_key", "join_block_matrices"]

log = logging.getLogger("tsspec_gguf.cache")

MAGIC = b"TSSPECW1"
ALIGNMENT = 64
FORMAT_VERSION = 1
DISABLED_VALUES = {"off", "none", "0", "false", "no"}
ENV_CACHE_DIR = "TSSPEC_CACHE_DIR"

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def cache_dir() -> Path | None:
    """The cache directory, or None when the operator disabled the cache."""
    configured = os.environ.get(ENV_CACHE_DIR)
    if configured is not None:
        if configured.strip().lower() in DISABLED_VALUES or not configured.strip():
            return None
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tsspec"


def cache_key(gguf_file, layout: str, dtype: torch.dtype) -> str:
    """A stable digest of what the prepared weights depend on."""
    digest = hashlib.sha256()
    stat_part = f"{os.path.realpath(gguf_file.path)}|{gguf_file.file_size}|{gguf_file.mtime_ns}"
    digest.update(stat_part.encode())
    for name in gguf_file.tensor_names:
        info = gguf_file.tensor_info(name)
        digest.update(f"|{name}:{info.ggml_type.name}:{info.shape}".encode())
    digest.update(f"|{layout}|{_NAMES.get(dtype, str(dtype))}|v{FORMAT_VERSION}".encode())
    return digest.hexdigest()[:32]


def join_block_matrices(tensors: Mapping[str, torch.Tensor]) -> dict:
    """A flat dict of tensors (what a cache entry holds) with every block matrix joined again.

    A ``tsspec_gguf.qlinear.BlockMatrix`` is stored flat as ``STEM.q<fmt>``, ``STEM.d`` and
    ``STEM.m`` (``BlockMatrix.tensors(STEM)``); this returns ``{STEM: BlockMatrix}`` for each
    such group and every other tensor under its own name, in the input's order. Model plugins
    that cache block weights call it on what ``WeightCache.load_or_build`` returns.
    """
    from .qlinear import FORMATS, BlockMatrix  # the kernels load only for plugins that use them

    parts = {f"q{fmt}" for fmt in FORMATS}
    stems = {name.rpartition(".")[0] for name in tensors if name.rpartition(".")[2] in parts}
    out: dict = {}
    for name, tensor in tensors.items():
        stem, _, part = name.rpartition(".")
        if stem in stems:
            if part in parts:
                out[stem] = BlockMatrix.from_tensors(tensors, stem)
        else:
            out[name] = tensor
    return out


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


class WeightCache:
    """Load-or-build of a dict of named tensors under one key."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, mode: str = "read"):
        self.directory = Path(directory) if directory is not None else cache_dir()
        if mode not in ("read", "mmap"):
            raise ValueError(f"mode must be 'read' or 'mmap', got {mode!r}")
        self.mode = mode
        self.last_hit = False  # whether the latest load_or_build came from the cache

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def entry_path(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{key}.tsw"

    # -- public --------------------------------------------------------------------------
    def load_or_build(
        self, key: str, build: Callable[[], Mapping[str, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        """The cached tensors for ``key``; else ``build()`` them, store them and return them.
        A cache that cannot be read or written never fails the load: it is rebuilt or skipped."""
        self.last_hit = False
        if not self.enabled:
            return dict(build())
        path = self.entry_path(key)
        if path.exists():
            try:
                tensors = self.read(path)
                self.last_hit = True
                return tensors
            except Exception as exc:  # corrupt, partial or foreign entry: rebuild it
                log.warning("weight cache entry %s is unusable (%s); rebuilding", path, exc)
        tensors = dict(build())
        try:
            self.write(path, tensors)
        except OSError as exc:
            log.warning("cannot write weight cache entry %s (%s); continuing without it", path, exc)
        return tensors

    # -- format ----------------------------------------------------------------------------
    def write(self, path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
        entries = {}
        offset = 0
        for name, tensor in tensors.items():
            if tensor.dtype not in _NAMES:
                raise ValueError(f"cannot cache dtype {tensor.dtype}")
            nbytes = tensor.numel() * tensor.element_size()
            entries[name] = {
                "dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape), "offset": offset, "nbytes": nbytes
            }
            offset = _align(offset + nbytes)
        blob = json.dumps({"version": FORMAT_VERSION, "tensors": entries, "data_bytes": offset}).encode()
        data_start = _align(len(MAGIC) + 8 + len(blob))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(MAGIC + struct.pack("<Q", len(blob)) + blob)
                for name, tensor in tensors.items():
                    raw = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
                    out.seek(data_start + entries[name]["offset"])
                    out.write(memoryview(raw))
                out.truncate(data_start + offset)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass
            raise

    def read(self, path: Path) -> dict[str, torch.Tensor]:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            magic = handle.read(len(MAGIC))
            if magic != MAGIC:
                raise ValueError("bad magic")
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > size:
                raise ValueError("header length past the end")
            header = json.loads(handle.read(length))
        if header.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {header.get('version')} is not {FORMAT_VERSION}")
        data_start, data_bytes = _align(len(MAGIC) + 8 + length), int(header["data_bytes"])
        if data_start + data_bytes != size:
            raise ValueError(f"size {size} does not match the header's {data_start + data_bytes}")
        if self.mode == "mmap":
            raw = np.memmap(path, dtype=np.uint8, mode="c", offset=data_start, shape=(data_bytes,))
            buffer = torch.from_numpy(raw)
        else:
            buffer = torch.empty(data_bytes, dtype=torch.uint8)
            with open(path, "rb") as handle:
                handle.seek(data_start)
                view = memoryview(buffer.numpy())
                got = handle.readinto(view)
            if got != data_bytes:
                raise ValueError("short read")
        tensors = {}
        for name, entry in header["tensors"].items():
            dtype = _DTYPES[entry["dtype"]]
            start, nbytes = int(entry["offset"]), int(entry["nbytes"])
            if start + nbytes > data_bytes:
                raise ValueError(f"tensor {name} lies past the data")
            tensors[name] = buffer[start : start + nbytes].view(dtype).view(entry["shape"])
        return tensors
