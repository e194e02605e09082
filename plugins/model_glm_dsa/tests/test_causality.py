"""Causality of the multi-row forward.

The trap: transformers 5.25's multi-row ``glm_moe_dsa`` forward is not causal once the keys
outnumber ``index_topk``. Its indexer takes ``topk`` over the whole row of T keys (the future
ones masked); where the ReLU-weighted scores tie at the top-k boundary, which tied key wins
depends on T, so appending tokens changes earlier rows, and a T-row forward differs from the
token-by-token decode. The decode with a cache is causal by construction, and it is the oracle
(test_oracle.py). Ours: row i chooses among keys <= i with a stable sort, whatever other rows
share the forward, so a k-row verify equals k one-row steps."""

from __future__ import annotations

import pytest
import torch



def _rows(target, tokens):
    logits, _ = target.spec_forward(tokens, all_logits_rows=True, want_hidden=False)
    target.spec_keep(len(tokens))
    return logits


@pytest.mark.oracle
def test_transformers_multi_row_forward_is_not_causal(rel_err, make_oracle, long_sequence):
    """index_topk 6, 2 indexer heads (ties at the boundary): rows 0-23 of a 24-row forward move
    when 24 tokens are appended, and the 48-row forward is far from the decode."""
    o = make_oracle(index_n_heads=2)
    full = o.prefill(long_sequence)
    assert rel_err(o.prefill(long_sequence[:24]), full[:24]) > 0.05
    assert rel_err(full, o.decode(long_sequence)[0]) > 0.05


def test_prefix_rows_do_not_change_when_tokens_are_appended(make_tie_target, long_sequence):
    short = _rows(make_tie_target(), long_sequence[:24])
    full = _rows(make_tie_target(), long_sequence)
    assert torch.equal(short, full[:24])


def test_ties_in_the_indexer_happen_here(make_tie_target, long_sequence):
    """The tie config really ties at the top-k boundary (else the tests here prove nothing about
    tie-breaking)."""
    import tsspec_model_glm_dsa.attention as attention

    seen = []
    original = attention.select

    def spy(scores, topk):
        v = scores.sort(descending=True).values
        if len(v) > topk and v[topk - 1] == v[topk]:
            seen.append(len(v))
        return original(scores, topk)

    attention.select = spy
    try:
        _rows(make_tie_target(dtype="float64"), long_sequence)
    finally:
        attention.select = original
    assert len(seen) >= 3, seen


def test_k_row_verify_equals_k_one_row_steps_float32(make_tie_target, long_sequence):
    """Bit for bit: a 7-row verify after a 20-row prefill, and the same 7 tokens one at a time."""
    many, one = make_tie_target(), make_tie_target()
    _rows(many, long_sequence[:20])
    _rows(one, long_sequence[:20])
    verify = _rows(many, long_sequence[20:27])
    steps = torch.cat([_rows(one, [t]) for t in long_sequence[20:27]])
    assert torch.equal(verify, steps)


def test_k_row_verify_equals_k_one_row_steps_float64(make_tie_target, long_sequence):
    """The batched float64 path: the same selections (ties included), so the same rows to
    summation order."""
    import tsspec_model_glm_dsa.attention as attention

    chosen: list[list] = [[], []]
    original = attention.select
    record = 0

    def spy(scores, topk):
        out = original(scores, topk)
        chosen[record].append(out.tolist())
        return out

    attention.select = spy
    try:
        many = make_tie_target(dtype="float64")
        _rows(many, long_sequence[:20])
        chosen[0].clear()
        verify = _rows(many, long_sequence[20:27])
        record = 1
        one = make_tie_target(dtype="float64")
        _rows(one, long_sequence[:20])
        chosen[1].clear()
        steps = torch.cat([_rows(one, [t]) for t in long_sequence[20:27]])
    finally:
        attention.select = original
    assert float((verify - steps).abs().max()) < 1e-12
    # per row and full layer: the batched forward visits layers then rows, the steps rows then layers
    full_layers = 3
    assert sorted(map(tuple, chosen[0])) == sorted(map(tuple, chosen[1]))
    assert len(chosen[0]) == 7 * full_layers


def test_rollback_then_verify_equals_decode_float64(make_tie_target, long_sequence):
    """Verify 6, keep 2, verify 6 others: the rows of one-row decoding of the kept sequence."""
    target = make_tie_target(dtype="float64")
    _rows(target, long_sequence[:21])
    target.spec_forward(long_sequence[21:27], all_logits_rows=True, want_hidden=False)
    target.spec_keep(2)
    second = _rows(target, long_sequence[30:36])
    ref = make_tie_target(dtype="float64")
    _rows(ref, long_sequence[:23])
    one = torch.cat([_rows(ref, [t]) for t in long_sequence[30:36]])
    assert float((second - one).abs().max()) < 1e-12
