"""The oracle: the tiny random transformers DeepSeek V4, converted to GGUF and loaded by the
plugin, must give the logits of transformers' token-by-token cached decode (1e-4 relative,
float32) for a multi-row prefill, one-row decode, a verify on top of the cache, and after a
partial acceptance that ends inside a compression window."""

from __future__ import annotations

import pytest

from tsspec.runtime import trunk as trunks

TOL = 1e-4


def _step(target, tokens, *, rows: bool = False):
    logits, hidden = target.spec_forward(tokens, all_logits_rows=rows, want_hidden=False)
    target.spec_keep(len(tokens))
    return logits


@pytest.mark.oracle
def test_prefill_matches_decode(rel_err, oracle, make_target, sequence):
    """One 48-row prefill from the GGUF file: every row equals transformers' decode."""
    target = make_target(from_file=True)
    logits = _step(target, sequence, rows=True)
    ref, _ = oracle.decode(sequence)
    assert rel_err(logits, ref) < TOL
    assert target.cache_seq_len == len(sequence)


@pytest.mark.oracle
def test_token_by_token_decode_matches(rel_err, oracle, make_target, sequence):
    target = make_target()
    ref, _ = oracle.decode(sequence)
    for t in range(len(sequence)):  # from position 0: every row's compressor state alone
        logits = _step(target, [sequence[t]])
        assert rel_err(logits[-1], ref[t]) < TOL, f"position {t}"


@pytest.mark.oracle
def test_hidden_rows_are_the_streams(rel_err, oracle, make_target, sequence):
    """want_hidden gives the last layer's hyper-connection streams (what the MTP head reads)."""
    target = make_target()
    _, hidden = target.spec_forward(sequence[:20], all_logits_rows=True, want_hidden=True)
    _, streams = oracle.decode(sequence)
    assert hidden.shape == (20, 2 * 32)
    assert rel_err(hidden, streams[:20].reshape(20, -1)) < TOL


@pytest.mark.oracle
def test_verify_and_partial_acceptance_inside_a_window(rel_err, oracle, make_target, sequence):
    """Prefill 19; verify 6 rows (positions 19..24: they close CSA windows and the HCA window
    16..23); keep 2 rows through the shared loop's trunk, so the cache ends at 21, inside both
    windows; then decode a different continuation: transformers' decode of the accepted
    sequence, row for row (the dropped rows' compressor state must leave no trace)."""
    target = make_target()
    trunk = target
    trunk.spec_ensure_capacity(64)
    trunks.forward_all(trunk, sequence[:19], want_hidden=False)
    rows = sequence[19:25]
    logits, _ = trunk.spec_forward(rows, all_logits_rows=True, want_hidden=False)
    ref, _ = oracle.decode(sequence[:25])
    assert rel_err(logits, ref[19:25]) < TOL
    assert trunks.keep(trunk, 2, 6, trunk.spec_verify_persists_accepted_kv) == "rewound"
    assert target.cache_seq_len == 21
    accepted = sequence[:21] + sequence[30:48]
    ref, _ = oracle.decode(accepted)
    logits, _ = trunk.spec_forward(accepted[21:25], all_logits_rows=True, want_hidden=False)  # a second verify on the kept cache
    assert rel_err(logits, ref[21:25]) < TOL
    assert trunks.keep(trunk, 4, 4, trunk.spec_verify_persists_accepted_kv) == "all"
    for t in range(25, len(accepted)):
        logits = _step(target, [accepted[t]])
        assert rel_err(logits[-1], ref[t]) < TOL, f"position {t}"


@pytest.mark.oracle
def test_rewind_into_a_window_then_reforward(rel_err, oracle, make_target, sequence):
    """spec_rewind_cache to a length inside an HCA window (and mid CSA window), then a multi-row
    forward of another suffix: transformers' decode of the new sequence."""
    target = make_target()
    _step(target, sequence[:40], rows=True)
    target.spec_rewind_cache(19)
    other = sequence[:19] + sequence[::-1][:20]
    logits = _step(target, other[19:], rows=True)
    ref, _ = oracle.decode(other)
    assert rel_err(logits, ref[19:]) < TOL
