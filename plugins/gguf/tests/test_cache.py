"""WeightCache: hits, rebuilds of corrupt entries, atomic writes, keys, the off switch."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tsspec_gguf import cache as cache_module
from tsspec_gguf.cache import WeightCache, cache_dir, cache_key
from tsspec_gguf.gguf_file import GGUFFile
from tsspec_gguf.gguf_writer import write_gguf


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(3, 5, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
        "c": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "empty": torch.zeros(0, 4),
        "h": torch.randn(2, 2, generator=g).half(),
    }


class Builder:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return sample_tensors()


def assert_same(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].dtype == expected[name].dtype and torch.equal(got[name], expected[name]), name


@pytest.mark.parametrize("mode", ["read", "mmap"])
def test_second_load_is_a_hit(tmp_path, mode):
    cache, build = WeightCache(tmp_path, mode=mode), Builder()
    first = cache.load_or_build("k1", build)
    assert not cache.last_hit
    second = cache.load_or_build("k1", build)
    assert cache.last_hit and build.calls == 1
    assert_same(second, sample_tensors())
    assert_same(first, sample_tensors())
    second["a"] += 1  # entries are private copies (copy-on-write when mapped)
    assert_same(cache.load_or_build("k1", build), sample_tensors())
    assert [p.name for p in tmp_path.iterdir()] == ["k1.tsw"]  # no temporary file left behind


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[: len(raw) // 2],  # truncated
        lambda raw: b"garbage" + raw[7:],  # bad magic
        lambda raw: raw[:8] + (10**12).to_bytes(8, "little") + raw[16:],  # absurd header length
        lambda raw: raw[:16] + b"{not json" + raw[25:],  # corrupt header
        lambda raw: raw + b"extra",  # size no longer matches
        lambda raw: b"",  # empty
    ],
)
def test_corrupt_entry_is_rebuilt(tmp_path, damage):
    cache, build = WeightCache(tmp_path), Builder()
    cache.load_or_build("k", build)
    path = cache.entry_path("k")
    path.write_bytes(damage(path.read_bytes()))
    assert_same(cache.load_or_build("k", build), sample_tensors())
    assert build.calls == 2 and not cache.last_hit
    assert_same(cache.load_or_build("k", build), sample_tensors())
    assert cache.last_hit and build.calls == 2


def test_failed_write_leaves_nothing_and_still_loads(tmp_path, monkeypatch):
    cache = WeightCache(tmp_path)

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(cache_module.os, "replace", broken_replace)
    assert_same(cache.load_or_build("k", Builder()), sample_tensors())
    assert list(tmp_path.iterdir()) == []


def test_unwritable_directory_still_loads(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = WeightCache(blocker / "sub")  # a directory cannot be made under a file
    assert_same(cache.load_or_build("k", Builder()), sample_tensors())


def test_cache_dir_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TSSPEC_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    for off in ("off", "none", "0", ""):
        monkeypatch.setenv("TSSPEC_CACHE_DIR", off)
        assert cache_dir() is None
    monkeypatch.setenv("TSSPEC_CACHE_DIR", "off")
    cache, build = WeightCache(), Builder()
    cache.load_or_build("k", build)
    cache.load_or_build("k", build)
    assert build.calls == 2 and not cache.enabled
    monkeypatch.delenv("TSSPEC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "tsspec"


def test_key_tracks_file_layout_and_dtype(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "demo", {}, {"w": np.zeros((2, 32), np.float32)})
    key = cache_key(GGUFFile(path), "layout-a", torch.float32)
    assert key == cache_key(GGUFFile(path), "layout-a", torch.float32)
    assert key != cache_key(GGUFFile(path), "layout-b", torch.float32)
    assert key != cache_key(GGUFFile(path), "layout-a", torch.bfloat16)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert key != cache_key(GGUFFile(path), "layout-a", torch.float32)
    write_gguf(path, "demo", {}, {"w": np.zeros((2, 64), np.float32)})
    assert key != cache_key(GGUFFile(path), "layout-a", torch.float32)


def test_join_block_matrices_rebuilds_what_tensors_flattened():
    from tsspec_gguf.cache import join_block_matrices
    from tsspec_gguf.qlinear import BlockMatrix

    weight = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))  # [N, K]
    flat = {"embd": torch.ones(3), **BlockMatrix.dense(weight).tensors("l0.wq"), "l0.norm": torch.zeros(2)}
    joined = join_block_matrices(flat)
    assert list(joined) == ["embd", "l0.wq", "l0.norm"]  # the input's order, one entry per matrix
    assert isinstance(joined["l0.wq"], BlockMatrix) and joined["l0.wq"].fmt == 32
    assert torch.equal(joined["l0.wq"].q, flat["l0.wq.q32"]) and torch.equal(joined["l0.norm"], flat["l0.norm"])
