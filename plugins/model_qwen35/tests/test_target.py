"""The speculation contract of ``Qwen35Target`` on both rollback paths: what a verify may touch,
what ``spec_keep`` does, what the restore path copies, which rewinds are legal, the capability fields."""

from __future__ import annotations

import pytest
import torch

from tsspec.protocols import SpeculativeTarget
from tsspec.runtime import trunk as trunks

from tsspec_model_qwen35.deltanet import DeltaNetState
from tsspec_model_qwen35.target import SNAPSHOTS_ENV, snapshots_enabled


def _recurrent(target) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(s.conv.clone(), s.ssm.clone()) for s in target._state.per_layer if isinstance(s, DeltaNetState)]


def _prefill(target, tokens):
    target.spec_ensure_capacity(64)
    target.spec_forward(tokens, all_logits_rows=False, want_hidden=False)
    assert target.spec_keep(len(tokens)) == ("committed" if target.per_row_snapshots else None)


def test_capabilities(make_target):
    target = make_target("qwen35")
    assert isinstance(target, SpeculativeTarget)
    assert target.spec_preferred_draft_window == 3
    assert target.speculation_profitable is True and target.speculation_refusal is None
    assert target.spec_verify_persists_accepted_kv is False  # a KV rewind never undoes GDN state
    assert target.config.architecture == "qwen35"
    assert target.config.extra["layer_types"] == ["linear_attention", "full_attention"] * 2
    assert target.spec_feature_size == target.config.hidden_size
    assert target.tokenizer is None  # token-id-only GGUF


def test_verify_leaves_live_state_and_commit_picks_the_slot(make_target, sequence):
    """Per-row snapshots: the verify reads the live state only; committing slot m gives exactly
    the state plain one-row decoding of the kept rows reaches (float64, so ~bitwise)."""
    target = make_target("qwen35", dtype="float64")
    _prefill(target, sequence[:10])
    before = _recurrent(target)
    logits, _ = target.spec_forward(sequence[10:14], all_logits_rows=True, want_hidden=False)
    assert target.counters.state_snapshots == 0  # nothing copied
    assert logits.shape == (4, target.config.vocab_size)
    assert target.cache_seq_len == 14
    for (c0, s0), (c1, s1) in zip(before, _recurrent(target)):
        assert torch.equal(c0, c1) and torch.equal(s0, s1)
    assert target.spec_keep(2) == "committed"
    assert target.cache_seq_len == 12
    committed = _recurrent(target)

    plain = make_target("qwen35", dtype="float64")
    _prefill(plain, sequence[:10])
    for tok in sequence[10:12]:
        plain.spec_forward([tok], all_logits_rows=False, want_hidden=False)
        plain.spec_keep(1)
    for (c0, s0), (c1, s1) in zip(committed, _recurrent(plain)):
        torch.testing.assert_close(c0, c1, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(s0, s1, rtol=1e-12, atol=1e-12)


def test_wide_verify_falls_back_and_keeps_the_contract(make_target, sequence):
    """Past MAX_SLOT_ROWS rows a verify commits in place from a copy; a partial keep re-forwards
    internally and leaves the state of the kept prefix."""
    from tsspec_model_qwen35.target import MAX_SLOT_ROWS

    rows = MAX_SLOT_ROWS + 4
    target = make_target("qwen35", dtype="float64")
    _prefill(target, sequence[:5])
    target.spec_forward(sequence[5 : 5 + rows], all_logits_rows=True, want_hidden=False)
    assert target.spec_keep(7) == "committed"
    assert target.cache_seq_len == 12 and target.counters.state_restores == 1
    after, _ = target.spec_forward(sequence[12:14], all_logits_rows=True, want_hidden=False)
    target.spec_keep(2)
    plain = make_target("qwen35", dtype="float64")
    _prefill(plain, sequence[:12])
    ref, _ = plain.spec_forward(sequence[12:14], all_logits_rows=True, want_hidden=False)
    torch.testing.assert_close(after, ref, rtol=1e-9, atol=1e-9)


def test_a_new_sequence_after_commits_starts_clean(make_target, sequence):
    """rewind(0) after slot commits (whose buffers became live state) gives a fresh model."""
    target = make_target("qwen35")
    trunk = target
    trunk.spec_ensure_capacity(64)
    first, _ = trunks.forward_all(trunk, sequence[:8], want_hidden=False)
    for start in (8, 10):
        trunk.spec_forward(sequence[start : start + 3], all_logits_rows=True, want_hidden=False)
        trunks.keep(trunk, 2, 3, trunk.spec_verify_persists_accepted_kv)
    trunk.spec_rewind_cache(0)
    again, _ = trunks.forward_all(trunk, sequence[:8], want_hidden=False)
    assert torch.equal(first, again)


def test_restore_path_copies_and_reforwards(make_target, sequence):
    target = make_target("qwen35", per_row_snapshots=False)
    assert target.per_row_snapshots is False
    trunk = target
    trunk.spec_ensure_capacity(64)
    trunks.forward_all(trunk, sequence[:10], want_hidden=False)
    before = _recurrent(target)
    trunk.spec_forward(sequence[10:14], all_logits_rows=True, want_hidden=False)
    assert target.counters.state_snapshots == 1  # the verify copied the state it started from
    assert any(not torch.equal(a[1], b[1]) for a, b in zip(before, _recurrent(target)))  # advanced live
    calls = target.counters.forward_calls
    assert trunks.keep(trunk, 2, 4, trunk.spec_verify_persists_accepted_kv) == "reforward"
    assert target.counters.state_restores == 1
    assert target.counters.forward_calls == calls + 1  # the second forward the snapshots avoid
    assert target.cache_seq_len == 12


def test_snapshot_path_commits_without_reforward(make_target, sequence):
    target = make_target("qwen35")
    trunk = target
    trunk.spec_ensure_capacity(64)
    trunks.forward_all(trunk, sequence[:10], want_hidden=False)
    trunk.spec_forward(sequence[10:14], all_logits_rows=True, want_hidden=False)
    calls = target.counters.forward_calls
    assert trunks.keep(trunk, 2, 4, trunk.spec_verify_persists_accepted_kv) == "committed"
    assert target.counters.forward_calls == calls
    assert target.counters.slot_commits == 1 and target.counters.state_snapshots == 0
    # a plain step after the commit continues from position 12
    trunks.forward_all(trunk, [sequence[12]], want_hidden=False)
    assert target.cache_seq_len == 13


@pytest.mark.parametrize("per_row", [True, False])
def test_illegal_uses_fail_loudly(make_target, sequence, per_row):
    target = make_target("qwen35", per_row_snapshots=per_row)
    _prefill(target, sequence[:10])
    with pytest.raises(ValueError, match="recurrent state"):
        target.spec_rewind_cache(5)  # the GDN state cannot go back by a KV rewind
    with pytest.raises(ValueError, match="vocabulary"):
        target.spec_forward([10_000], all_logits_rows=False, want_hidden=False)
    with pytest.raises(ValueError):
        target.spec_ensure_capacity(10_000)
    if per_row:
        with pytest.raises(ValueError, match="verify"):
            target.spec_keep(4)  # a committing forward cannot keep a prefix
        target.spec_forward(sequence[10:13], all_logits_rows=True, want_hidden=False)
        with pytest.raises(RuntimeError, match="not resolved"):
            target.spec_forward(sequence[13:14], all_logits_rows=False, want_hidden=False)
        with pytest.raises(ValueError, match="cannot keep"):
            target.spec_keep(5)
        target.spec_rewind_cache(10)  # drops the unresolved verify
        assert target.cache_seq_len == 10
    target.spec_rewind_cache(10)  # to where the recurrent state stands: fine
    target.spec_rewind_cache(0)
    assert target.cache_seq_len == 0
    assert all(not s.ssm.any() and not s.conv.any() for s in target._state.per_layer if isinstance(s, DeltaNetState))


def test_feature_taps_are_residuals_entering_layers(make_target, sequence):
    target = make_target("qwen35", dtype="float64")
    target.spec_set_feature_taps([0, 2, 4])
    assert target.spec_feature_size == 3 * target.config.hidden_size
    target.spec_ensure_capacity(16)
    _, hidden = target.spec_forward(sequence[:5], all_logits_rows=False, want_hidden=True)
    target.spec_keep(5)
    H = target.config.hidden_size
    assert hidden.shape == (5, 3 * H)
    torch.testing.assert_close(hidden[:, :H], target.embed(sequence[:5]))  # entering layer 0
    # entering layer num_layers is the final residual: its norm is the default hidden row
    target.spec_set_feature_taps(None)
    target.spec_rewind_cache(0)
    _, plain_hidden = target.spec_forward(sequence[:5], all_logits_rows=False, want_hidden=True)
    torch.testing.assert_close(target.final_norm(hidden[:, 2 * H:]), plain_hidden)
    with pytest.raises(ValueError):
        target.spec_set_feature_taps([5])


def test_drafter_surface_matches_forward(make_target, sequence):
    target = make_target("qwen35")
    target.spec_ensure_capacity(16)
    logits, hidden = target.spec_forward(sequence[:6], all_logits_rows=True, want_hidden=True)
    target.spec_keep(6)
    torch.testing.assert_close(target.lm_head(hidden), logits)
    assert target.embed([1, 2]).shape == (2, target.config.hidden_size)


def test_snapshot_switch_from_env_and_options(monkeypatch, gguf_path):
    from tsspec.runtime.loading import LoadOptions
    from tsspec.runtime.options import SpeculationOptions

    from tsspec_model_qwen35.loader import load_qwen35

    assert snapshots_enabled({}) is True
    assert snapshots_enabled({SNAPSHOTS_ENV: "0"}) is False
    monkeypatch.setenv(SNAPSHOTS_ENV, "0")
    assert load_qwen35(gguf_path("qwen35"), LoadOptions()).per_row_snapshots is False
    monkeypatch.delenv(SNAPSHOTS_ENV)
    target = load_qwen35(gguf_path("qwen35"), LoadOptions())
    assert target.per_row_snapshots is True
    target.per_row_snapshots = False  # the attribute tests flip
    assert target.per_row_snapshots is False
    opts = LoadOptions(speculation=SpeculationOptions(extra={"q35_verify_snapshots": "0"}))
    assert load_qwen35(gguf_path("qwen35"), opts).per_row_snapshots is False
