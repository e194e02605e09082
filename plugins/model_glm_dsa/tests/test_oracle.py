"""The oracle: the tiny random transformers GLM 5.x, converted to GGUF and loaded by the plugin,
gives the logits of transformers' token-by-token cached decode (its multi-row forward is not
causal, test_causality.py) for a multi-row prefill, one-row decode, a verify on top of the
cache, after a partial acceptance, and after a rewind: 1e-4 relative in float32, 1e-9 in float64
(against transformers kept in float64, ``conftest.float64_oracle``)."""

from __future__ import annotations

import pytest

TOL32, TOL64 = 1e-4, 1e-9


def _step(target, tokens, *, rows: bool = False):
    logits, _ = target.spec_forward(tokens, all_logits_rows=rows, want_hidden=False)
    target.spec_keep(len(tokens))
    return logits


@pytest.mark.oracle
def test_prefill_from_the_file_matches_decode(rel_err, oracle, make_target, sequence):
    target = make_target(from_file=True)
    logits, hidden = target.spec_forward(sequence, all_logits_rows=True, want_hidden=True)
    ref, ref_hidden = oracle.decode(sequence)
    assert rel_err(logits, ref) < TOL32
    assert rel_err(hidden, ref_hidden) < TOL32  # the post-final-norm rows the NextN head reads
    assert target.cache_seq_len == len(sequence)


@pytest.mark.oracle
def test_token_by_token_decode_matches(rel_err, oracle, make_target, sequence):
    target = make_target()
    ref, _ = oracle.decode(sequence)
    for t in range(len(sequence)):
        assert rel_err(_step(target, [sequence[t]])[-1], ref[t]) < TOL32, f"position {t}"


def _verify_partial_accept(target, decode, rel_err, sequence, tol):
    """Prefill 17; verify 6 rows; keep 2; verify a different continuation on the kept cache;
    then decode one row at a time: transformers' decode of the accepted sequence, row for row
    (the dropped rows leave no trace in the compressed KV or the indexer keys)."""
    _step(target, sequence[:17], rows=True)
    logits, _ = target.spec_forward(sequence[17:23], all_logits_rows=True, want_hidden=False)
    ref, _ = decode(sequence[:23])
    assert rel_err(logits, ref[17:23]) < tol
    target.spec_keep(2)
    assert target.cache_seq_len == 19
    accepted = sequence[:19] + sequence[25:40]
    ref, _ = decode(accepted)
    logits, _ = target.spec_forward(accepted[19:24], all_logits_rows=True, want_hidden=False)
    assert rel_err(logits, ref[19:24]) < tol
    target.spec_keep(5)
    for t in range(24, len(accepted)):
        assert rel_err(_step(target, [accepted[t]])[-1], ref[t]) < tol, f"position {t}"


@pytest.mark.oracle
def test_verify_and_partial_acceptance_float32(rel_err, oracle, make_target, sequence):
    _verify_partial_accept(make_target(), oracle.decode, rel_err, sequence, TOL32)


@pytest.mark.oracle
def test_verify_and_partial_acceptance_float64(rel_err, oracle64, make_target, sequence):
    _verify_partial_accept(make_target(dtype="float64"), oracle64, rel_err, sequence, TOL64)


@pytest.mark.oracle
def test_prefill_float64(rel_err, oracle64, make_target, sequence):
    logits = _step(make_target(dtype="float64"), sequence, rows=True)
    assert rel_err(logits, oracle64(sequence)[0]) < TOL64


@pytest.mark.oracle
def test_rewind_then_reforward(rel_err, oracle, make_target, sequence):
    target = make_target()
    _step(target, sequence[:36], rows=True)
    target.spec_rewind_cache(15)
    other = sequence[:15] + sequence[::-1][:20]
    logits = _step(target, other[15:], rows=True)
    assert rel_err(logits, oracle.decode(other)[0][15:]) < TOL32
