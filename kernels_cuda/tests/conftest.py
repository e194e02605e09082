"""Shared fixtures: one torch thread (tiny models on a shared 2-core machine run faster), and a
random DFlash(2) drafter pair for the call-site tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


V, H, TAPS = 40, 16, 2


class Target:
    """Just what a DFlash drafter borrows: embedding rows and the LM head."""

    def __init__(self, g):
        self.table = torch.randn(V, H, generator=g)

    def embed(self, ids):
        return self.table[torch.as_tensor(ids)]

    def lm_head(self, h):
        return h @ self.table.T


def build_dflash_pair(seed, kernels, *, conv=True, selector=True):
    """(torch-path head, head with ``kernels``, feature rows) over one random DFlash(2) drafter."""
    from tsspec_block.config import DFlashConfig
    from tsspec_block.head import DFlashDraftHead
    from tsspec_block.selector import SelectorWeights
    from tsspec_block.weights import ConvWeights, DFlashWeights, LayerWeights

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
    plain = DFlashDraftHead(cfg, weights, target)
    fused = DFlashDraftHead(cfg, weights, target, kernels=kernels)
    return plain, fused, feats


@pytest.fixture
def dflash_pair():
    pytest.importorskip("tsspec_block.head")
    return build_dflash_pair
