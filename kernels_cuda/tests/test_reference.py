"""The op contracts (``reference``, what every CUDA kernel is checked against on the device)
equal the model plugins' torch paths on the CPU, including the per-row slots and the deferred
commit, so a kernel that matches the contract matches the plugin."""

from __future__ import annotations

import pytest
import torch

from tsspec_kernels_cuda import reference
from tsspec_kernels_cuda.reference import InjectLayer, RingView

deltanet = pytest.importorskip("tsspec_model_qwen35.deltanet")
block_head = pytest.importorskip("tsspec_block.head")
block_ops = pytest.importorskip("tsspec_block.ops")

F32 = torch.float32


def _gdn_layer(seed, *, H=24, nk=2, nv=4, dk=8, dv=6, K=4):
    g = torch.Generator().manual_seed(seed)
    conv_dim, value_dim = 2 * nk * dk + nv * dv, nv * dv
    w = deltanet.DeltaNetWeights(
        in_proj=torch.randn(conv_dim + value_dim + 2 * nv, H, generator=g) * 0.3,
        conv=torch.randn(conv_dim, K, generator=g) * 0.5,
        dt_bias=torch.randn(nv, generator=g),
        a=-torch.rand(nv, generator=g) * 2,
        norm=torch.rand(dv, generator=g) + 0.5,
        out=torch.randn(H, value_dim, generator=g) * 0.3,
        key_index=torch.arange(nv) // (nv // nk),
    )
    layer = deltanet.DeltaNetLayer(w, num_k=nk, num_v=nv, dk=dk, dv=dv, kernel=K, eps=1e-6, state_dtype=F32)
    state = layer.new_state(F32)
    state.conv.copy_(torch.randn(state.conv.shape, generator=g))
    state.ssm.copy_(torch.randn(state.ssm.shape, generator=g) * 0.2)
    return layer, state, g


def _op_inputs(layer, x):
    mixed, _, b, a = torch.nn.functional.linear(x, layer.w.in_proj).split(layer.splits, dim=-1)
    w = layer.w
    return (mixed.contiguous(), b.contiguous(), a.contiguous(), w.conv, w.a, w.dt_bias, w.key_index)


def _verify(layer, state, x, R=8):
    mixed, b, a, conv_w, a_neg, dt_bias, key_index = _op_inputs(layer, x)
    slots = torch.full((R, *state.ssm.shape), float("nan"))
    window = torch.full((layer.kernel - 1 + R, layer.conv_dim), float("nan"))
    out = reference.gdn_verify(mixed, state.conv, conv_w, b, a, a_neg, dt_bias, key_index, state.ssm, slots, window,
                               num_k=layer.num_k, dk=layer.dk, scale=layer.scale)
    return out, slots, window


@pytest.mark.parametrize("rows", [1, 3, 6])
def test_gdn_verify_equals_the_layer(rows):
    layer, state, g = _gdn_layer(rows)
    x = torch.randn(rows, 24, generator=g)
    live = state.clone()
    out, slots, window = _verify(layer, state, x)
    q, k, v, gl, beta, z, win = layer._prepare(x, state.conv)
    ref_slots = [torch.empty_like(state.ssm) for _ in range(rows)]
    o, _ = deltanet.delta_rule_rows(q, k, v, gl, beta, state.ssm, slots=ref_slots)
    torch.testing.assert_close(out, o)
    for t in range(rows):
        torch.testing.assert_close(slots[t], ref_slots[t])
    torch.testing.assert_close(window[: layer.kernel - 1 + rows], win)
    assert torch.equal(state.ssm, live.ssm) and torch.equal(state.conv, live.conv)  # read only


def test_commit_after_partial_acceptance_equals_a_forward_of_the_kept_rows():
    layer, state, g = _gdn_layer(7)
    x = torch.randn(5, 24, generator=g)
    ahead = state.clone()
    _, slots, window = _verify(layer, state, x)
    m = 2  # keep rows 0..2 of 5
    reference.gdn_commit([slots], [window], [state.ssm], [state.conv], m)
    layer.forward_commit(x[: m + 1], ahead)
    torch.testing.assert_close(state.ssm, ahead.ssm)
    torch.testing.assert_close(state.conv, ahead.conv)


def test_deferred_step_from_a_slot_equals_commit_then_step():
    layer, state, g = _gdn_layer(11)
    x = torch.randn(4, 24, generator=g)
    step_x = torch.randn(1, 24, generator=g)
    _, slots, window = _verify(layer, state, x)
    m = 1
    # deferred: start the step from slot m and window rows m+1 .. m+K-1, never committing them
    mixed, b, a, conv_w, a_neg, dt_bias, key_index = _op_inputs(layer, step_x)
    state_out = torch.empty_like(state.ssm)
    conv_out = torch.empty_like(state.conv)
    o = reference.gdn_step(mixed, window[m + 1 : m + layer.kernel], conv_w, b, a, a_neg, dt_bias, key_index,
                           slots[m], state_out, conv_out, num_k=layer.num_k, dk=layer.dk, scale=layer.scale)
    # eager: commit slot m, then a committing one-row step of the layer
    eager = state.clone()
    reference.gdn_commit([slots], [window], [eager.ssm], [eager.conv], m)
    q, k, v, gl, beta, z, win = layer._prepare(step_x, eager.conv)
    o_ref, s_ref = deltanet.delta_rule_rows(q, k, v, gl, beta, eager.ssm)
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(state_out, s_ref)
    torch.testing.assert_close(conv_out, win[1:])


def _dflash_head(seed, *, window=6, block=4):
    from tsspec_block.config import DFlashConfig
    from tsspec_block.weights import DFlashWeights, LayerWeights

    g = torch.Generator().manual_seed(seed)
    H, nh, nkv, hd, vd, Fs, taps = 16, 4, 2, 8, 8, 24, 2

    def r(*shape, s=0.3):
        return torch.randn(*shape, generator=g) * s

    cfg = DFlashConfig(num_layers=2, hidden_size=H, ffn_size=32, n_head=nh, n_head_kv=nkv, head_dim=hd, value_dim=vd,
                       rope_base=10000.0, eps=1e-6, block_size=block, target_layers=(0, 1), target_hidden_size=Fs // taps,
                       mask_token_id=0, sliding_window=window, sliding_layers=(True, False))
    layers = tuple(
        LayerWeights(attn_norm=r(H, s=1) + 1, wq=r(nh * hd, H), wk=r(nkv * hd, H), wv=r(nkv * vd, H), wo=r(H, nh * vd),
                     q_norm=r(hd, s=1) + 1, k_norm=r(hd, s=1) + 1, ffn_norm=r(H, s=1) + 1, w_gate=r(32, H),
                     w_up=r(32, H), w_down=r(H, 32), bk=r(nkv * hd) if i == 0 else None, bv=r(nkv * vd) if i == 0 else None)
        for i in range(2))
    weights = DFlashWeights(fc=r(H, Fs), enc_norm=r(H, s=1) + 1, out_norm=r(H, s=1) + 1, layers=layers)
    return block_head.DFlashDraftHead(cfg, weights, target=None), g


def _rings(head):
    return [RingView(s.keys, s.values, s.positions, s.capacity if s.ring else 0) for s in head._stores]


def test_inject_equals_the_drafter():
    head, g = _dflash_head(3)
    mine, _ = _dflash_head(3)
    positions = torch.arange(40, 45)
    features = torch.randn(5, head.config.feature_size, generator=g)
    for store in mine._stores:  # the linear store must be long enough, as the wrapper ensures
        store._grow(64)
    head.inject_rows(positions, features)
    w = mine.weights
    layers = [InjectLayer(l.wk, l.bk, l.wv, l.bv, l.k_norm) for l in w.layers]
    reference.dflash_inject(features, w.fc, w.enc_norm, layers, _rings(mine), positions,
                            eps=head.config.eps, rope_base=head.config.rope_base)
    for ref_store, store in zip(head._stores, mine._stores):
        for pos in positions.tolist():
            a = ref_store.gather(pos, pos + 1)
            b = store.gather(pos, pos + 1)
            torch.testing.assert_close(b[0], a[0])
            torch.testing.assert_close(b[1], a[1])
            assert b[2].tolist() == [pos]


@pytest.mark.parametrize("window", [None, 6])
def test_block_attention_equals_the_drafter(window):
    g = torch.Generator().manual_seed(5)
    B, nh, nkv, hd, vd, R, start = 4, 4, 2, 8, 6, 16, 20
    q = torch.randn(B, nh, hd, generator=g)
    ctx_k, ctx_v = torch.randn(R, nkv, hd, generator=g), torch.randn(R, nkv, vd, generator=g)
    ctx_pos = torch.tensor([p if p % 5 else -1 for p in range(8, 8 + R)])  # gaps; some beyond start
    blk_k, blk_v = torch.randn(B, nkv, hd, generator=g), torch.randn(B, nkv, vd, generator=g)
    got = reference.dflash_block_attention(q, ctx_k, ctx_v, ctx_pos, blk_k, blk_v, start=start, window=window,
                                           scale=hd**-0.5)
    lo = start - window if window is not None else 0
    keep = torch.nonzero((ctx_pos >= max(lo, 0)) & (ctx_pos < start)).flatten()
    keys, values = torch.cat([ctx_k[keep], blk_k]), torch.cat([ctx_v[keep], blk_v])
    pos = torch.arange(start, start + B)
    key_pos = torch.cat([ctx_pos[keep], pos])
    visible = torch.ones(B, keys.shape[0], dtype=torch.bool) if window is None else (pos[:, None] - key_pos).abs() <= window
    torch.testing.assert_close(got, block_ops.block_attention(q, keys, values, visible, hd**-0.5))


def test_grouped_conv_equals_the_drafter():
    g = torch.Generator().manual_seed(9)
    B, H, K, gs = 5, 8, 3, 4
    x, base = torch.randn(B, H, generator=g), torch.randn(K, H, generator=g)
    coef = torch.randn(B, 2, K, H // gs, generator=g)[:, 0]  # the strided view the drafter passes
    residual = torch.randn(B, H, generator=g)
    want = block_ops.grouped_dynamic_conv(x, coef, base, gs)
    torch.testing.assert_close(reference.dflash_grouped_conv(x, coef, base, gs), want)
    torch.testing.assert_close(reference.dflash_grouped_conv(x, coef, base, gs, residual), residual + want)
