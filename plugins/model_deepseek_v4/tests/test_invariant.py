"""Batch invariance of the float32 path: a k-row verify reproduces one-row decoding BIT FOR BIT
(``torch.equal`` on the logits and the hidden streams), on the oracle config (sliding, CSA with
an indexer that selects, HCA; hash and learned MoE; two hyper-connection streams), for verifies
crossing compression windows and after a keep / a rewind inside a window."""

from __future__ import annotations

import pytest
import torch

from tsspec_gguf import native

PREFIX = 13  # CSA windows of 2 and HCA windows of 8: verifies from here cross both boundaries


def _forward(target, tokens):
    return target.spec_forward(tokens, all_logits_rows=True, want_hidden=True)


def _decoded(target, tokens):
    """One-row forwards, rows concatenated."""
    parts = [_forward(target, [t]) for t in tokens]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _assert_bitwise(got, want):
    assert got[0].dtype == torch.float32
    assert torch.equal(got[0], want[0]), f"logits differ by {float((got[0] - want[0]).abs().max()):.3g}"
    assert torch.equal(got[1], want[1]), f"hidden rows differ by {float((got[1] - want[1]).abs().max()):.3g}"


@pytest.mark.parametrize("rows", [2, 5, 9])
def test_verify_rows_equal_one_row_decode_bit_for_bit(make_target, sequence, rows):
    verify, decode = make_target(with_mtp=False), make_target(with_mtp=False)
    for t in (verify, decode):
        _forward(t, sequence[:PREFIX])
    span = sequence[PREFIX : PREFIX + rows]
    _assert_bitwise(_forward(verify, span), _decoded(decode, span))


def test_verify_after_keep_and_rewind_inside_windows_bit_for_bit(make_target, sequence):
    """Verify 5 rows, keep 2 (mid CSA and HCA windows), verify 9 across the HCA boundary, rewind
    into the window just closed, verify 5 more: each verify == one-row decoding of the same
    accepted sequence."""
    verify, decode = make_target(with_mtp=False), make_target(with_mtp=False)
    for t in (verify, decode):
        _forward(t, sequence[:PREFIX])
    _forward(verify, sequence[PREFIX : PREFIX + 5])
    verify.spec_keep(2)
    _decoded(decode, sequence[PREFIX : PREFIX + 2])
    span = sequence[30:39]  # positions 15..23: the HCA window 8..15 closes at 15, 16..23 at 23
    _assert_bitwise(_forward(verify, span), _decoded(decode, span))
    for t in (verify, decode):
        t.spec_rewind_cache(19)
    span = sequence[40:45]
    _assert_bitwise(_forward(verify, span), _decoded(decode, span))
    assert verify.state_fingerprint()[0] == decode.state_fingerprint()[0] == 24


def test_the_indexer_selects_and_the_kernel_is_used(make_target, sequence):
    """The test config exercises the paths it claims: the indexer picks fewer entries than a row
    sees, and dense float32 matrices with K a multiple of 32 ride the compiled kernel."""
    import tsspec_model_deepseek_v4.attention as attention
    from tsspec_model_deepseek_v4.invariant import block_of

    target = make_target(with_mtp=False)
    picked = []
    original = attention.indexer_select

    def spy(w, cache, q, head_w, visible):
        chosen = original(w, cache, q, head_w, visible)
        picked.append((int(chosen.sum()), visible))
        return chosen

    attention.indexer_select = spy
    try:
        _forward(target, sequence[:24])
    finally:
        attention.indexer_select = original
    assert any(n < visible for n, visible in picked), picked
    if native.available():
        assert block_of(target.trunk.w.layers[0].attn.q_a) is not None


def test_without_compiled_kernels_rows_go_one_at_a_time(make_target, sequence, monkeypatch):
    """Without the compiled kernel every matrix and norm falls back to one row at a time: still
    bit for bit."""
    import tsspec_model_deepseek_v4.invariant as invariant

    monkeypatch.setattr(invariant.native, "available", lambda: False)
    verify, decode = make_target(with_mtp=False), make_target(with_mtp=False)
    assert invariant.block_of(verify.trunk.w.layers[0].attn.q_a) is None
    for t in (verify, decode):
        _forward(t, sequence[:PREFIX])
    span = sequence[PREFIX : PREFIX + 5]
    _assert_bitwise(_forward(verify, span), _decoded(decode, span))
