"""The identity of a GGUF model file, for matching drafters trained on it.

A drafter learned on one target is worthless on another, even one with the same shapes (a base
model and its instruct fine-tune), so a bundled drafter names its target by:

* ``architecture``  general.architecture;
* ``shape_digest``  sha256 over every tensor's name, shape and storage type (cheap: header only);
* ``sha256``        the whole file's sha256 (computed only when the shape digest matches).

``matches(path)`` checks the cheap key first, so an unrelated model never hashes its file.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import attrs

__all__ = ["TargetIdentity", "shape_digest", "file_sha256", "identify"]


def shape_digest(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(architecture, shape digest) of a GGUF, from its header only."""
    from .gguf_file import GGUFFile

    with GGUFFile(path) as gguf_file:
        arch = gguf_file.architecture
        h = hashlib.sha256(arch.encode())
        for name in sorted(gguf_file.tensor_names):
            info = gguf_file.tensor_info(name)
            h.update(f"{name}:{tuple(info.shape)}:{int(info.ggml_type)}\n".encode())
    return arch, h.hexdigest()[:32]


@functools.lru_cache(maxsize=16)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of the file (cached per path, size and mtime within a process)."""
    p = Path(path).resolve()
    stat = p.stat()
    return _sha256_cached(str(p), stat.st_size, stat.st_mtime_ns)


@attrs.frozen
class TargetIdentity:
    architecture: str
    shape_digest: str
    sha256: str | None = None  # None: any file with these shapes

    def matches(self, path: str | os.PathLike[str]) -> bool:
        try:
            arch, digest = shape_digest(path)
        except Exception:  # not a readable GGUF: nothing to match
            return False
        if arch != self.architecture or digest != self.shape_digest:
            return False
        return self.sha256 is None or file_sha256(path) == self.sha256

    def to_json(self) -> dict:
        return attrs.asdict(self)


def identify(path: str | os.PathLike[str]) -> TargetIdentity:
    """The full identity (architecture, shape digest, sha256) of a GGUF file."""
    arch, digest = shape_digest(path)
    return TargetIdentity(arch, digest, file_sha256(path))
