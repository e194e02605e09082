"""The DFlash / DFlash2 drafter's kernel call sites, driven on the CPU by the torch contracts
registered as its kernels: identical drafts and confidences, the same ring contents after
injections (sliding ring and linear store), and the compact lattice walked on the host."""

from __future__ import annotations

import pytest
import torch

from tsspec_kernels_cuda import reference

head_mod = pytest.importorskip("tsspec_block.head")
from tsspec_block.config import DFlashConfig  # noqa: E402
from tsspec_block.selector import SelectorWeights  # noqa: E402
from tsspec_block.weights import ConvWeights, DFlashWeights, LayerWeights  # noqa: E402

OPS = {op: getattr(reference, op) for op in
       ("dflash_inject", "dflash_block_attention", "dflash_grouped_conv", "selector_lattice")}
V, H, TAPS = 40, 16, 2


class Target:
    """Just what a DFlash drafter borrows: embedding rows and the LM head."""

    def __init__(self, g):
        self.table = torch.randn(V, H, generator=g)

    def embed(self, ids):
        return self.table[torch.as_tensor(ids)]

    def lm_head(self, h):
        return h @ self.table.T


def _pair(seed, *, conv=True, selector=True):
    g = torch.Generator().manual_seed(seed)
    nh, nkv, hd, K, gs, rank = 4, 2, 8, 3, 4, 6

    def r(*shape, s=0.3):
        return torch.randn(*shape, generator=g) * s

    cfg = DFlashConfig(num_layers=2, hidden_size=H, ffn_size=24, n_head=nh, n_head_kv=nkv, head_dim=hd, value_dim=hd,
                       rope_base=10000.0, eps=1e-6, block_size=5, target_layers=(0, 1), target_hidden_size=H,
                       mask_token_id=1, sliding_window=6, sliding_layers=(True, False),
                       conv_kernel_size=K if conv else None, conv_group_size=gs if conv else None,
                       selector_rank=rank if selector else None, selector_top_k=4 if selector else None)

    def conv_weights():
        return ConvWeights(base=r(2, K, H), proj=r(2 * K * (H // gs), H)) if conv else None

    layers = tuple(
        LayerWeights(attn_norm=r(H, s=1) + 1, wq=r(nh * hd, H), wk=r(nkv * hd, H), wv=r(nkv * hd, H), wo=r(H, nh * hd),
                     q_norm=r(hd, s=1) + 1, k_norm=r(hd, s=1) + 1, ffn_norm=r(H, s=1) + 1, w_gate=r(24, H),
                     w_up=r(24, H), w_down=r(H, 24), attn_conv=conv_weights(), ffn_conv=conv_weights())
        for _ in range(2))
    sel = SelectorWeights(r(rank, H), r(V, rank, s=1), r(V, rank, s=1), 4) if selector else None
    weights = DFlashWeights(fc=r(H, TAPS * H), enc_norm=r(H, s=1) + 1, out_norm=r(H, s=1) + 1, layers=layers,
                            selector=sel)
    target = Target(g)
    feats = torch.randn(40, TAPS * H, generator=g)
    plain = head_mod.DFlashDraftHead(cfg, weights, target)
    fused = head_mod.DFlashDraftHead(cfg, weights, target, kernels=OPS)
    return plain, fused, feats


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
def test_fused_call_sites_equal_the_torch_path(conv, selector):
    plain, fused, feats = _pair(4, conv=conv, selector=selector)
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


def test_a_float64_drafter_keeps_torch():
    plain, _, feats = _pair(5)
    f64 = head_mod.DFlashDraftHead(plain.config, plain.weights, plain.target, kernels=OPS, dtype=torch.float64)
    f64.draft_catch_up([0, 1, 2], feats[:3], 1)
    f64.draft_block(3, feats[2], 3, 4)
    assert f64.kernels_in_use == []


def test_long_commits_go_through_torch():
    _, fused, feats = _pair(6)
    fused.draft_catch_up(list(range(40)), feats[:40], 1)  # 40 rows: over one launch's 32
    assert "dflash_inject" not in fused.kernels_in_use
