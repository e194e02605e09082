"""Causality of the multi-row forward (the trap transformers 5.24 falls into, see the README):
a prefix's rows never change when tokens are appended, and a multi-row forward equals one-row
decoding row for row, also where the lightning indexer's scores tie at the top-k boundary."""

from __future__ import annotations

import torch


def _rows(target, tokens):
    logits, _ = target.spec_forward(tokens, all_logits_rows=True, want_hidden=False)
    return logits


def test_prefix_rows_do_not_change_when_tokens_are_appended(make_tie_target, sequence, rel_err):
    """float32: only summation order may differ (transformers' prefill differs here by 3% and
    more: its indexer breaks the ties by the row's length)."""
    short = _rows(make_tie_target(), sequence[:33])
    full = _rows(make_tie_target(), sequence)
    assert rel_err(short, full[:33]) < 1e-5
    assert torch.equal(short.argmax(-1), full[:33].argmax(-1))


def test_ties_in_the_indexer_happen_here(make_tie_target, sequence):
    """The config really produces exact ties at the top-k boundary (else the tests above prove
    nothing about tie-breaking)."""
    import tsspec_model_deepseek_v4.attention as attention

    target = make_tie_target(dtype="float64")
    seen = []
    original = attention.indexer_select

    def spy(w, cache, x, r, positions, n, cos, sin, rope):
        chosen = original(w, cache, x, r, positions, n, cos, sin, rope)
        q = rope.apply(torch.nn.functional.linear(r, w.q_b).view(x.shape[0], w.heads, -1), cos, sin)
        scores = torch.relu(torch.einsum("rhd,nd->rhn", q, cache.entries[:n])).mul(
            torch.nn.functional.linear(x, w.proj).unsqueeze(-1)).sum(1)
        vis = attention.visible_entries(positions, w.compressor.ratio)
        for i in range(x.shape[0]):
            v = scores[i, : int(vis[i])].sort(descending=True).values
            if len(v) > w.topk and v[w.topk - 1] == v[w.topk]:
                seen.append(int(positions[i]))
        return chosen

    attention.indexer_select = spy
    try:
        _rows(target, sequence)
    finally:
        attention.indexer_select = original
    assert len(seen) >= 3, seen


def test_multi_row_forward_equals_one_row_decode_float64(make_tie_target, sequence):
    many = _rows(make_tie_target(dtype="float64"), sequence)
    target = make_tie_target(dtype="float64")
    one = torch.cat([_rows(target, [t]) for t in sequence])
    assert float((many - one).abs().max()) < 1e-10
    assert torch.equal(many.argmax(-1), one.argmax(-1))


def test_verify_rows_after_keep_equal_decode_float64(make_tie_target, sequence):
    """Verify 5 rows, keep 2 (inside windows), verify again: the same rows as one-row decode."""
    target = make_tie_target(dtype="float64")
    _rows(target, sequence[:21])
    target.spec_keep(21)
    _rows(target, sequence[21:26])
    target.spec_keep(2)
    second = _rows(target, sequence[30:36])
    ref = make_tie_target(dtype="float64")
    _rows(ref, sequence[:23])
    one = torch.cat([_rows(ref, [t]) for t in sequence[30:36]])
    assert float((second - one).abs().max()) < 1e-10
