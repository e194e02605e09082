"""NextNModule: the unrolled training pass equals the head driven row by row as the draft-head
speculator drives it (catch-up on true rows, then chained steps), and the unroll mask."""

from __future__ import annotations

import torch

from tsspec_draft_head.nextn_model import NextNConfig, NextNModule, unroll_mask


def test_unroll_mask_matches_what_a_chain_sees():
    m = unroll_mask(5, 2)  # [5, 10]: step-1 keys, then step-2 keys
    # a step-2 query at q=3 (chain started at p=2): true keys 1..2, its own step-2 key at 3
    assert m[3].nonzero().flatten().tolist() == [1, 2, 5 + 3]
    assert unroll_mask(3, 1)[0].tolist() == [True, False, False]


class _Target:
    def __init__(self, table):
        self.table = table

    def embed(self, ids):
        return self.table[torch.as_tensor(ids)]


def test_unrolled_training_equals_row_by_row_drafting():
    torch.manual_seed(0)
    V, H, L = 40, 16, 9
    cfg = NextNConfig(hidden_size=H, intermediate_size=24, num_heads=4, num_kv_heads=2, head_dim=4, draft_vocab=V)
    module = NextNModule(cfg, V)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    table = torch.randn(V, H)
    tokens = torch.randint(V, (L,))
    h_true = torch.randn(L, H)
    outs = module.unrolled(table[tokens][None], h_true[None], 3)  # each [1, L, H]

    from tsspec_draft_head.nextn_file import NextNFileHead

    head = NextNFileHead(module, _Target(table))
    p = 5  # chain starts at position p: catch-up over 0..p with the true rows
    logits, out = head.draft_catch_up_and_step(tokens[: p + 1].tolist(), torch.cat([torch.zeros(1, H), h_true[:p]]), 0)
    assert torch.allclose(out, outs[0][0, p], atol=1e-5)
    for j in (2, 3):  # chained steps feed the corpus token with the head's own output
        logits, out = head.draft_step(int(tokens[p + j - 1]), out, p + j - 1)
        assert torch.allclose(out, outs[j - 1][0, p + j - 1], atol=1e-5)


def test_int8_packed_drafting_stays_close_and_training_is_untouched():
    from tsspec_gguf import native
    from tsspec_gguf.qlinear import BlockMatrix

    if native.kernels() is None:
        import pytest

        pytest.skip("the compiled kernels were not built")
    torch.manual_seed(1)
    V, H = 64, 32
    cfg = NextNConfig(hidden_size=H, intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, draft_vocab=V)
    module = NextNModule(cfg, V)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    w = module.head.detach()
    q = BlockMatrix.quantize_int8(w)
    assert q.fmt == 8 and q.shape == tuple(w.shape)
    # per block, rounding moves a weight by at most half a step (max |w| / 254)
    step = w.view(V, H // 32, 32).abs().amax(-1, keepdim=True) / 127.0
    err = (q.dequantize().view(V, H // 32, 32) - w.view(V, H // 32, 32)).abs()
    assert bool((err <= step / 2 + 1e-7).all())
    x = torch.randn(3, H)
    with torch.no_grad():
        dense = module.logits(x)
        assert module.pack_int8()
        packed = module.logits(x)
    assert not torch.equal(dense, packed)  # the packed path really ran
    assert torch.allclose(dense, packed, atol=0.05 * float(dense.abs().max()))
    # training (grad-tracking inputs) keeps the float weights
    y = torch.randn(3, H, requires_grad=True)
    assert torch.equal(module.logits(y), torch.nn.functional.linear(y, module.head))
