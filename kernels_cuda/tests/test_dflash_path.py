"""The DFlash / DFlash2 drafter's kernel call sites, driven on the CPU by the torch contracts
registered as its kernels: identical drafts and confidences, the same ring contents after
injections (sliding ring and linear store), and the compact lattice walked on the host."""

from __future__ import annotations

import pytest
import torch

from tsspec_kernels_cuda import reference

head_mod = pytest.importorskip("tsspec_block.head")

OPS = {op: getattr(reference, op) for op in
       ("dflash_inject", "dflash_block_attention", "dflash_grouped_conv", "selector_lattice")}


def _drive(head, feats):
    drafts = []
    head.draft_catch_up(list(range(12)), feats[:12], 1)  # 12 prefill rows: one fused launch
    position = 12
    for step, kept in enumerate([3, 1, 4, 2, 5, 3]):
        tokens, conf = head.draft_block(5 + step, feats[position - 1], position, 4)
        drafts.append((tokens, conf))
        head.draft_catch_up(list(range(kept)), feats[position : position + kept], position + 1)
        position += kept
    return drafts


@pytest.mark.parametrize("conv,selector", [(True, True), (False, False)], ids=["dflash2", "dflash"])
def test_fused_call_sites_equal_the_torch_path(dflash_pair, conv, selector):
    plain, fused, feats = dflash_pair(4, OPS, conv=conv, selector=selector)
    for (t1, c1), (t2, c2) in zip(_drive(plain, feats), _drive(fused, feats)):
        assert t1 == t2
        torch.testing.assert_close(torch.tensor(c2), torch.tensor(c1), rtol=1e-5, atol=1e-6)
    for a, b in zip(plain._stores, fused._stores):
        hi = a.max_position() + 1
        ka, va, pa = a.gather(0, hi)
        kb, vb, pb = b.gather(0, hi)
        assert pa.tolist() == pb.tolist()
        torch.testing.assert_close(kb, ka, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(vb, va, rtol=1e-5, atol=1e-6)
    want = {"dflash_inject", "dflash_block_attention"} | ({"dflash_grouped_conv", "selector_lattice"} if conv else set())
    assert set(fused.kernels_in_use) == want
    assert plain.kernels_in_use == []


def test_a_float64_drafter_keeps_torch(dflash_pair):
    plain, _, feats = dflash_pair(5, OPS)
    f64 = head_mod.DFlashDraftHead(plain.config, plain.weights, plain.target, kernels=OPS, dtype=torch.float64)
    f64.draft_catch_up([0, 1, 2], feats[:3], 1)
    f64.draft_block(3, feats[2], 3, 4)
    assert f64.kernels_in_use == []


def test_long_commits_go_through_torch(dflash_pair):
    _, fused, feats = dflash_pair(6, OPS)
    fused.draft_catch_up(list(range(40)), feats[:40], 1)  # 40 rows: over one launch's 32
    assert "dflash_inject" not in fused.kernels_in_use
