"""The compiled kernels' thread pool (cpu_kernels.c): its statistics switch and handshake probe."""

from __future__ import annotations

import time

import pytest
import torch

from tsspec_gguf import native, qlinear

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels were not built")


@pytest.fixture
def pool_stats():
    kernels = native.kernels()
    kernels.set_pool_stats(False)
    yield kernels
    kernels.set_pool_stats(False)


def gemm(kernels, n: int, k: int, rows: int, threads: int, int8: bool = False) -> torch.Tensor:
    """x [rows, k] @ W^T of a random int8-block matrix [n, k] on the kernels (int8: the int8
    arithmetic)."""
    g = torch.Generator().manual_seed(1)
    w = qlinear.BlockMatrix.quantize_int8(torch.randn(n, k, generator=g))
    x = torch.randn(rows, k, generator=g)
    out = torch.empty(rows, n)
    kernels.gemm(w.fmt, w.q.data_ptr(), w.d.data_ptr(), w.m.data_ptr(), n, k, x.data_ptr(), rows, out.data_ptr(), 0,
                 threads, int8)
    return out


def test_statistics_count_the_regions_and_chunks_a_gemm_ran(pool_stats):
    pool_stats.set_pool_stats(True)
    pool_stats.set_guided(False)
    try:
        gemm(pool_stats, 512, 256, 1, 2)
    finally:
        pool_stats.set_guided(True)
    gemm(pool_stats, 512, 256, 1, 1)
    stats = pool_stats.pool_stats()
    assert set(stats) == {"gemm"}
    s = stats["gemm"]
    assert s["regions"] == 1 and s["inline_regions"] == 1
    assert s["chunks"] == 8 + 64  # 2 threads, equal chunks: 4 each; 1 thread: 8 output rows a chunk
    assert 64 <= s["caller_chunks"] <= s["chunks"]
    assert s["wall_ns"] >= s["caller_busy_ns"] > 0 and s["wait_ns"] >= 0
    assert s["joined"] <= 1 and s["waits"] <= 1


def test_statistics_stay_off_unless_asked_and_do_not_change_results(pool_stats):
    gemm(pool_stats, 512, 256, 1, 2)
    assert pool_stats.pool_stats() == {}
    off = gemm(pool_stats, 512, 256, 3, 2)
    pool_stats.set_pool_stats(True)
    on = gemm(pool_stats, 512, 256, 3, 2)
    assert torch.equal(on, off)
    pool_stats.set_pool_stats(False)
    assert pool_stats.pool_stats() == {}


def test_handshake_probe_times_each_region(pool_stats):
    """Each region's chunks wait for each other, so a 2-thread region cannot finish before both
    threads came (or the 1 ms timeout passed); one thread runs its region alone."""
    two = pool_stats.probe_handshake(50, 2)
    one = pool_stats.probe_handshake(50, 1)
    assert len(two) == len(one) == 50 and min(two) > 0 and min(one) >= 0
    with pytest.raises(ValueError, match="probe_handshake"):
        pool_stats.probe_handshake(0, 2)


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("n,k,rows", [(3072, 64, 1), (1000, 96, 1), (577, 128, 3), (49152, 32, 1), (24, 4096, 2)])
def test_guided_chunks_give_every_row_the_equal_chunks_result(pool_stats, n, k, rows, int8):
    """Chunks that shrink as the rows left do (the default on 2+ threads) change which thread
    computes a row, never its value: equal to equal chunks and to one thread, bit for bit."""
    one = gemm(pool_stats, n, k, rows, 1, int8)
    pool_stats.set_pool_stats(True)
    try:
        guided = gemm(pool_stats, n, k, rows, 2, int8)
        chunks = pool_stats.pool_stats()["gemm"]["chunks"]
        pool_stats.set_guided(False)
        equal = gemm(pool_stats, n, k, rows, 2, int8)
    finally:
        pool_stats.set_guided(True)
    assert torch.equal(guided, one) and torch.equal(equal, one)
    if n * k * rows >= 65536:  # smaller calls run on one thread
        assert 1 < chunks <= 96


def test_idle_workers_sleep_and_wake_with_the_same_results(pool_stats):
    """Regions far apart (the workers sleep between them) and back to back (they spin): the same
    rows every time."""
    want = gemm(pool_stats, 2048, 256, 1, 1)
    for gap in (0.0, 0.0, 0.003, 0.0, 0.001):
        time.sleep(gap)
        assert torch.equal(gemm(pool_stats, 2048, 256, 1, 2), want)
