"""The oracle: tiny random HF models, converted to GGUF files and loaded by the plugin, must give
HF's logits (1e-4 relative, float32) for prefill, token-by-token decode, a multi-row verify on
top of the cache, and after a partial-acceptance commit, on both rollback paths."""

from __future__ import annotations

import pytest

from tsspec.runtime import trunk as trunks

ARCHS = ("qwen35", "qwen35moe", "qwen3next")
TOL = 1e-4


def _forward(target, tokens, *, verify: bool = False, hidden: bool = False):
    logits, h = target.spec_forward(tokens, all_logits_rows=verify, want_hidden=hidden)
    if not verify:
        target.spec_keep(len(tokens))
    return logits, h


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_matches_hf(arch, rel_err, oracle, make_target, sequence):
    """A 70-row prefill (the chunked recurrence) from the GGUF file: every row's logits and
    post-norm hidden state."""
    target = make_target(arch, from_file=True)
    logits, hidden = target.spec_forward(sequence, all_logits_rows=True, want_hidden=True)
    target.spec_keep(len(sequence))
    assert rel_err(logits, oracle(arch).logits(sequence)) < TOL
    assert rel_err(hidden, oracle(arch).hidden(sequence)) < TOL
    assert target.cache_seq_len == len(sequence)


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_token_by_token_decode_matches_hf(arch, rel_err, oracle, make_target, sequence):
    target = make_target(arch, from_file=True)
    ref = oracle(arch).logits(sequence[:40])
    logits, _ = _forward(target, sequence[:3])
    assert rel_err(logits[-1], ref[2]) < TOL
    for t in range(3, 40):
        logits, _ = _forward(target, [sequence[t]])
        assert rel_err(logits[-1], ref[t]) < TOL, f"position {t}"


@pytest.mark.oracle
@pytest.mark.parametrize("per_row", [True, False], ids=["snapshots", "restore"])
@pytest.mark.parametrize("arch", ARCHS)
def test_verify_and_partial_commit_match_hf(arch, per_row, rel_err, oracle, make_target, sequence):
    """Prefill 12; verify 4 rows on top of the cache (each row matches HF); keep 2 of them through
    the shared loop's trunk (per-row commit or restore + re-forward); then decode a different
    continuation and compare with HF run on the accepted sequence."""
    o = oracle(arch)
    target = make_target(arch, per_row_snapshots=per_row)
    trunk = target
    trunk.spec_ensure_capacity(40)
    trunks.forward_all(trunk, sequence[:12], want_hidden=False)
    rows = sequence[12:16]
    logits, _ = trunk.spec_forward(rows, all_logits_rows=True, want_hidden=False)
    assert rel_err(logits, o.logits(sequence[:16])[12:16]) < TOL
    mode = trunks.keep(trunk, 2, 4, trunk.spec_verify_persists_accepted_kv)
    assert mode == ("committed" if per_row else "reforward")
    assert target.cache_seq_len == 14
    accepted = sequence[:14] + sequence[40:52]  # the rejected rows 14, 15 never happened
    ref = o.logits(accepted)
    for t in range(14, len(accepted)):
        logits, _ = _forward(target, [accepted[t]])
        assert rel_err(logits[-1], ref[t]) < TOL, f"position {t}"


@pytest.mark.oracle
@pytest.mark.parametrize("per_row", [True, False], ids=["snapshots", "restore"])
def test_full_acceptance_then_verify_again(per_row, rel_err, oracle, make_target, sequence):
    """All rows kept, then a second verify stacked on the first: still HF's rows."""
    o = oracle("qwen35")
    target = make_target("qwen35", per_row_snapshots=per_row)
    trunk = target
    trunk.spec_ensure_capacity(40)
    trunks.forward_all(trunk, sequence[:8], want_hidden=False)
    ref = o.logits(sequence[:20])
    for start in (8, 12):
        rows = sequence[start : start + 4]
        logits, _ = trunk.spec_forward(rows, all_logits_rows=True, want_hidden=False)
        assert rel_err(logits, ref[start : start + 4]) < TOL
        trunks.keep(trunk, 4, 4, trunk.spec_verify_persists_accepted_kv)
    logits, _ = _forward(target, [sequence[16]])
    assert rel_err(logits[-1], ref[16]) < TOL
