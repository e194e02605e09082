"""tsspec_gguf.native: huge pages for the memory a step streams (byte_ranges, huge_pages)."""

from __future__ import annotations

import pathlib
import shutil
import sys

import pytest
import torch

from tsspec_gguf import native, qlinear

HUGE = 2 << 20
THP = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_offered() -> bool:
    """Linux with transparent huge pages not switched off ("[never]")."""
    return sys.platform.startswith("linux") and THP.exists() and "[never]" not in THP.read_text()


def test_byte_ranges_join_views_and_near_neighbours_and_keep_far_ones_apart():
    t = torch.zeros(3 * native.PAGE_GAP + 1000, dtype=torch.uint8)
    base = t.data_ptr()
    views = [t[0:100], t[50:200], t[200 + native.PAGE_GAP - 1 : 200 + native.PAGE_GAP + 10]]
    far = t[200 + 2 * native.PAGE_GAP + 20 :]
    empty = t[10:10]
    ranges = native.byte_ranges([far, views[2], empty, views[0], views[1]])
    assert ranges == [(base, base + 200 + native.PAGE_GAP + 10), (base + 200 + 2 * native.PAGE_GAP + 20, base + t.numel())]
    floats = torch.zeros(10)
    assert native.byte_ranges([floats[2:5]]) == [(floats.data_ptr() + 8, floats.data_ptr() + 20)]
    assert native.byte_ranges([]) == []


@pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels were not built")
def test_huge_pages_keep_every_value_and_answer_zero_when_switched_off():
    kernels = native.kernels()
    g = torch.Generator().manual_seed(3)
    t = torch.randint(0, 256, (3 * HUGE + 12345,), dtype=torch.uint8, generator=g)
    before = t.clone()
    advised = native.huge_pages([t])
    assert 0 <= advised <= t.numel() and advised % HUGE == 0
    assert torch.equal(t, before)  # collapsing moves pages, never bytes
    kernels.set_huge_pages(False)
    try:
        assert native.huge_pages([t]) == 0
    finally:
        kernels.set_huge_pages(True)
    assert kernels.advise_huge_pages(t.data_ptr(), 100, True) == 0  # no whole 2 MiB page inside
    with pytest.raises(ValueError, match="wraps"):
        kernels.advise_huge_pages(2**64 - 4096, 8192, False)


@pytest.mark.skipif(not native.available() or not thp_offered(), reason="no transparent huge pages here")
def test_huge_pages_advise_the_whole_2mib_pages_inside_the_range():
    """Advice alone (no collapse: memory not yet written stays uncommitted) covers every whole
    2 MiB page between the range's ends."""
    t = torch.empty(5 * HUGE, dtype=torch.uint8)
    start = t.data_ptr()
    first = -(-start // HUGE) * HUGE
    whole = ((start + t.numel()) // HUGE) * HUGE - first
    assert native.huge_pages([t], collapse=False) == whole >= 4 * HUGE


@pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels were not built")
def test_a_matmul_on_huge_pages_equals_the_one_before():
    g = torch.Generator().manual_seed(4)
    w = qlinear.BlockMatrix.quantize_int8(torch.randn(4096, 576, generator=g))  # 2.6 MB of blocks
    x = torch.randn(3, 576, generator=g)
    before = w.linear(x)
    native.huge_pages([w.q, w.d, w.m])
    assert torch.equal(w.linear(x), before)


def test_byte_ranges_keep_a_whole_page_gap_apart():
    """A gap of a whole page may be unmapped: madvise would refuse a range joined across it."""
    t = torch.zeros(4 * native.PAGE_GAP, dtype=torch.uint8)
    base = t.data_ptr()
    a, b = t[:100], t[100 + native.PAGE_GAP : 200 + native.PAGE_GAP]
    assert native.byte_ranges([a, b]) == [(base, base + 100), (base + 100 + native.PAGE_GAP, base + 200 + native.PAGE_GAP)]
    c = t[99 + native.PAGE_GAP : 200 + native.PAGE_GAP]  # one byte closer: joined
    assert native.byte_ranges([a, c]) == [(base, base + 200 + native.PAGE_GAP)]


def test_load_build_loads_another_copy_of_the_kernels(tmp_path):
    module = native.kernels()
    if module is None:
        pytest.skip("the kernels were not built")
    copy = tmp_path / pathlib.Path(module.__file__).name
    shutil.copyfile(module.__file__, copy)
    other = native.load_build(str(copy))
    assert other is not module
    same = ("simd", "int8")  # pool_workers: a pool starts at first use, per loaded copy
    assert {k: other.info()[k] for k in same} == {k: module.info()[k] for k in same}
    with pytest.raises(ImportError, match="no kernels build"):
        native.load_build(str(tmp_path / "missing.txt"))
