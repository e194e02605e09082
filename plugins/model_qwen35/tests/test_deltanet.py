"""The Gated DeltaNet pieces on tiny float64 tensors: the chunked prefill recurrence against the
per-row one, per-row slots against sequential states, conv-window commits, partial RoPE."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tsspec_model_qwen35.deltanet import DeltaNetSlots, DeltaNetState, delta_rule_chunked, delta_rule_rows
from tsspec_model_qwen35.ops import PartialRope, l2_normalize, rms_norm

F64 = torch.float64


def _inputs(T, nv, dk, dv, seed):
    g = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(T, nv, dk, generator=g, dtype=F64)) / dk**0.5
    k = l2_normalize(torch.randn(T, nv, dk, generator=g, dtype=F64))
    v = torch.randn(T, nv, dv, generator=g, dtype=F64)
    decay = -3 * torch.rand(T, nv, generator=g, dtype=F64)
    beta = torch.rand(T, nv, generator=g, dtype=F64)
    s0 = torch.randn(nv, dk, dv, generator=g, dtype=F64)
    return q, k, v, decay, beta, s0


def _reference(q, k, v, decay, beta, s0):
    """The rule exactly as published, one head and one row at a time."""
    outs, s = [], s0.clone()
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            s[h] = decay[t, h].exp() * s[h]
            delta = beta[t, h] * (v[t, h] - s[h].T @ k[t, h])
            s[h] = s[h] + torch.outer(k[t, h], delta)
        outs.append(torch.einsum("hkv,hk->hv", s, q[t]))
    return torch.stack(outs), s


@settings(max_examples=12, deadline=None)
@given(T=st.integers(1, 40), chunk=st.sampled_from([4, 8, 16]), seed=st.integers(0, 10_000))
def test_chunked_equals_rows(T, chunk, seed):
    args = _inputs(T, 3, 4, 5, seed)
    o_rows, s_rows = delta_rule_rows(*args)
    o_chunk, s_chunk = delta_rule_chunked(*args, chunk=chunk)
    torch.testing.assert_close(o_chunk, o_rows, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_chunk, s_rows, rtol=1e-10, atol=1e-10)


def test_rows_match_the_written_rule():
    args = _inputs(7, 2, 3, 4, 1)
    o, s = delta_rule_rows(*args)
    o_ref, s_ref = _reference(*args)
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(s, s_ref)


def test_slots_hold_the_state_after_every_row_and_leave_the_input():
    q, k, v, decay, beta, s0 = _inputs(5, 2, 3, 4, 2)
    keep = s0.clone()
    slots = torch.empty(5, 2, 3, 4, dtype=F64)
    out, final = delta_rule_rows(q, k, v, decay, beta, s0, slots=slots)
    assert torch.equal(s0, keep)
    for m in range(5):
        _, s_m = delta_rule_rows(q[: m + 1], k[: m + 1], v[: m + 1], decay[: m + 1], beta[: m + 1], s0)
        assert torch.equal(slots[m], s_m)
    assert torch.equal(final, slots[-1])


@pytest.mark.parametrize("kernel", [1, 2, 4])
def test_conv_window_commit(kernel):
    """Slot m's conv state = rows [m+1 .. m+K-1] of concat(old state, new rows)."""
    old = torch.arange((kernel - 1) * 3, dtype=F64).reshape(kernel - 1, 3)
    new = 100 + torch.arange(12, dtype=F64).reshape(4, 3)
    state = DeltaNetState(old.clone(), torch.zeros(1, 1, 1, dtype=F64))
    buffers = state.slot_buffers(4)
    for m, buf in enumerate(buffers):
        buf.fill_(m)
    live = state.ssm
    slots = DeltaNetSlots(buffers, torch.cat([old, new]), kernel)
    slots.commit_into(state, 1)  # keep 2 rows
    expected = torch.cat([old, new[:2]])[-(kernel - 1):] if kernel > 1 else old
    assert torch.equal(state.conv, expected)
    assert state.ssm.item() == 1.0
    assert state.ssm is buffers[1] and state.spare[1] is live  # swapped, not copied
    assert state.slot_buffers(4)[1] is live


def test_partial_rope_rotates_only_the_first_dims():
    rope = PartialRope(4, 10_000.0, F64)
    x = torch.randn(2, 3, 8, dtype=F64)  # [heads, rows, head_dim]
    cos, sin = rope.tables(torch.tensor([0, 5, 9]))
    y = rope.apply(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:])
    assert torch.equal(y[:, 0], x[:, 0])  # position 0: identity
    torch.testing.assert_close(y[..., :4].norm(dim=-1), x[..., :4].norm(dim=-1))  # a rotation
    # NeoX pairs (i, i + dims/2) rotate by angle pos * base^(-2i/dims)
    angle = 5 * 10_000.0 ** (-0 / 4)
    a, b = x[0, 1, 0], x[0, 1, 2]
    torch.testing.assert_close(y[0, 1, 0], a * torch.cos(torch.tensor(angle, dtype=F64)) - b * torch.sin(torch.tensor(angle, dtype=F64)))


def test_rms_norm_is_plain():
    x = torch.tensor([[3.0, 4.0]], dtype=F64)
    w = torch.tensor([2.0, 1.0], dtype=F64)
    rms = (12.5 + 1e-6) ** 0.5
    torch.testing.assert_close(rms_norm(x, w, 1e-6), torch.tensor([[6 / rms, 4 / rms]], dtype=F64))
