"""DraftHeadSpeculator driven directly (no runtime): chaining, the gate, commit and folding."""

from __future__ import annotations

import attrs
import pytest
import torch

from tsspec.protocols import DraftContext, Speculator
from tsspec_model_toy.heads import ToyPerTokenHead
from tsspec_draft_head import FOLD_ENV, DraftHeadSpeculator, fold_enabled

VOCAB, HIDDEN = 41, 10


def _rows(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _spec(*, fold=True, pmin=0.0, window=4, head=None, seed=3, **head_kwargs):
    head = head or ToyPerTokenHead(VOCAB, HIDDEN, seed=seed, **head_kwargs)
    return DraftHeadSpeculator(
        head, max_draft_tokens=window, feature_size=HIDDEN, min_draft_prob=pmin, fold_catch_up=fold
    )


def _ctx(history, carry, *, max_tokens=8, adjust=None, vocab=VOCAB):
    return DraftContext(
        last_token=history[-1],
        position=len(history) - 1,
        max_tokens=max_tokens,
        history=tuple(history),
        carry_hidden=carry,
        adjust_logits=adjust,
        vocab_size=vocab,
    )


def _drive(spec, steps=6, seed=0):
    """A scripted run: prefill, then each step keeps the first draft (if any) and a fresh token.
    Returns every proposal; the same script gives the same commits whatever the speculator does
    with them, so two speculators can be compared."""
    gen = torch.Generator().manual_seed(seed)
    history = [int(t) for t in torch.randint(0, VOCAB, (6,), generator=gen)]
    rows = _rows(64, seed + 100)  # rows[p] = the trunk row of position p
    rows_for = lambda start, n: torch.cat([torch.zeros(1, HIDDEN, dtype=torch.float64), rows])[start : start + n]
    spec.reset()
    spec.commit(history[:-1], rows_for(0, len(history) - 1), 0)
    proposals = []
    for _ in range(steps):
        p = len(history) - 1
        drafts = spec.propose(_ctx(history, rows[p - 1]))
        proposals.append(drafts)
        kept = [history[-1], *drafts[:1]]
        spec.commit(kept, rows_for(p, len(kept)), p)
        history += drafts[:1] + [int(torch.randint(0, VOCAB, (1,), generator=gen))]
    return proposals


def test_satisfies_the_speculator_protocol():
    spec = _spec()
    assert isinstance(spec, Speculator)
    assert spec.name == "draft-head" and spec.needs_hidden_state and not spec.handles_own_prefill
    assert spec.default_min_draft_prob == 0.75
    assert spec.can_arm_after_prefix_reuse is False
    assert _spec(resumes_after_gap=True).can_arm_after_prefix_reuse is True


def test_fold_and_no_fold_propose_identically():
    folded, unfolded = _spec(fold=True), _spec(fold=False)
    a, b = _drive(folded), _drive(unfolded)
    assert a == b and any(a)
    assert folded.counters.catch_ups == 0 and folded.counters.fused == 6
    assert unfolded.counters.fused == 0 and unfolded.counters.catch_ups == 7  # prefill + 6 steps
    assert unfolded.counters.head_calls == folded.counters.head_calls + 7


def test_folding_makes_one_head_call_per_step_at_window_one():
    spec = _spec(fold=True, window=1)
    _drive(spec, steps=5)
    head = spec.head
    assert head.calls == 5 and head.fused_calls == 5 and head.catch_up_calls == 0 and head.step_calls == 0
    spec = _spec(fold=False, window=1)
    _drive(spec, steps=5)
    assert spec.head.calls == 5 + 6  # a step and a catch-up per step, plus the prefill catch-up


def test_chain_feeds_its_own_hidden_back_and_writes_the_head_cache():
    spec = _spec(pmin=0.0, window=3)
    history = [1, 2, 3, 4]
    spec.commit(history[:-1], torch.cat([torch.zeros(1, HIDDEN, dtype=torch.float64), _rows(2, 1)]), 0)
    drafts = spec.propose(_ctx(history, _rows(3, 1)[2]))
    assert len(drafts) == 3  # pmin 0: always to the window
    assert spec.head.cache_positions == [0, 1, 2, 3, 4, 5]  # the draft chain wrote 4 and 5
    assert spec.head.cache_tokens == [1, 2, 3, 4, *drafts[:2]]
    assert spec.counters.fused == 1 and spec.counters.steps == 2


def test_gate_at_one_drafts_nothing_and_stops_after_one_call():
    spec = _spec(pmin=1.0)
    assert _drive(spec) == [[]] * 6
    assert spec.counters.gate_stops == 6 and spec.counters.head_calls == 6


def test_gate_stops_the_chain_at_the_first_unconfident_step():
    probs = []
    spec = _spec(pmin=0.75, window=8, logit_scale=3.0)
    original = spec.head.draft_step

    def recording_step(token, h, pos):
        logits, h_out = original(token, h, pos)
        probs.append(torch.softmax(torch.topk(logits, 10).values, 0)[0].item())
        return logits, h_out

    spec.head.draft_step = recording_step
    lengths = []
    for seed in range(12):
        probs.clear()
        spec.reset()
        drafts = spec.propose(_ctx([seed, 5, 7], _rows(1, seed)[0]))
        lengths.append(len(drafts))
        # every drafted step passed the gate; the step after the last draft failed it
        assert all(p >= 0.75 for p in probs[: len(drafts)])
        if len(drafts) < 8:
            assert len(probs) == len(drafts) + 1 and probs[-1] < 0.75
    assert max(lengths) > 0 and min(lengths) < 8  # both outcomes were exercised


def test_adjust_logits_sees_the_right_preceding_tokens_and_changes_drafts():
    seen = []

    def adjust(logits, preceding):
        seen.append(list(preceding))
        out = logits.clone()
        out[list(set(preceding))] = -1e9  # a huge repeat penalty: never repeat
        return out

    history = [2, 3, 4]
    carry = _rows(1, 9)[0]
    plain = _spec(pmin=0.0, window=6, logit_scale=0.01).propose(_ctx(history, carry))
    penalised = _spec(pmin=0.0, window=6, logit_scale=0.01).propose(_ctx(history, carry, adjust=adjust))
    assert seen == [history + penalised[:k] for k in range(6)]
    assert len(set(penalised) | set(history)) == len(penalised) + len(history)  # no repeats
    assert plain != penalised  # a near-uniform head repeats itself without the penalty


def test_budget_and_padded_vocabulary():
    spec = _spec(pmin=0.0, window=8)
    assert len(spec.propose(_ctx([1, 2], _rows(1, 0)[0], max_tokens=2))) == 2
    assert spec.propose(_ctx([1, 2], _rows(1, 0)[0], max_tokens=0)) == []
    narrow = spec.propose(_ctx([1, 2], _rows(1, 0)[0], vocab=3))
    assert narrow and all(t < 3 for t in narrow)


def test_no_carry_hidden_means_no_proposal_and_no_head_call():
    spec = _spec()
    assert spec.propose(_ctx([1, 2], None)) == [] and spec.head.calls == 0


def test_gap_in_commits_does_not_crash():
    """A gap in the commits: unfolded, every commit reached the head as it came; folded with a
    catch-up bound, the pending rows before the gap are dropped unseen (the bound would have
    dropped them had every commit come); folded without a bound, they are caught up first."""
    for fold, bound, held in ((False, 8, [0, 1, 2, 20, 21]), (True, 8, [20, 21, 22]),
                              (True, None, [0, 1, 2, 20, 21])):
        spec = DraftHeadSpeculator(ToyPerTokenHead(VOCAB, HIDDEN, seed=3), max_draft_tokens=4, feature_size=HIDDEN,
                                   min_draft_prob=0.0, fold_catch_up=fold, catch_up_rows=bound)
        spec.commit([1, 2, 3], _rows(3, 0), 0)
        spec.commit([7, 8], _rows(2, 1), 20)  # positions 3..19 never seen
        drafts = spec.propose(_ctx([0] * 22 + [9], _rows(1, 2)[0]))
        assert len(drafts) == 4
        assert spec.head.cache_positions[: len(held)] == held


def test_pending_rows_not_leading_to_the_proposal_are_flushed():
    spec = _spec(fold=True, pmin=0.0)
    spec.commit([1, 2, 3], _rows(3, 0), 0)
    spec.propose(_ctx([1, 2, 3, 4, 5], _rows(1, 0)[0]))  # position 4: the head never got 3
    assert spec.counters.catch_ups == 1 and spec.counters.fused == 0
    assert spec.head.cache_positions[:3] == [0, 1, 2] and 4 in spec.head.cache_positions


def test_overlapping_commit_replaces_the_pending_tail():
    spec = _spec(fold=True)
    spec.commit([1, 2, 3, 4], _rows(4, 0), 0)
    spec.commit([9, 8], _rows(2, 1), 2)
    spec.propose(_ctx([1, 2, 9, 8, 5], _rows(1, 2)[0]))
    assert spec.head.cache_tokens[:5] == [1, 2, 9, 8, 5] and spec.counters.fused == 1


def test_missing_hidden_rows_stand_in_as_zeros():
    spec = _spec(fold=False)
    spec.commit([1, 2], None, 0)
    assert spec.head.cache_positions == [0, 1]


def test_failed_fused_call_keeps_the_pending_rows():
    spec = _spec(fold=True)
    spec.commit([1, 2], _rows(2, 0), 0)
    real = spec.head.draft_catch_up_and_step
    spec.head.draft_catch_up_and_step = lambda *a: (_ for _ in ()).throw(RuntimeError("device lost"))
    with pytest.raises(RuntimeError):
        spec.propose(_ctx([1, 2, 3], _rows(1, 1)[0]))
    spec.head.draft_catch_up_and_step = real
    spec.propose(_ctx([1, 2, 3], _rows(1, 1)[0]))
    assert spec.head.cache_tokens[:3] == [1, 2, 3]


def test_reset_drops_pending_rows_and_the_head_cache():
    spec = _spec(fold=True)
    spec.commit([1, 2], _rows(2, 0), 0)
    spec.reset()
    spec.propose(_ctx([5], _rows(1, 0)[0]))
    assert spec.counters.fused == 0 and spec.head.cache_tokens[0] == 5


def test_fold_env_is_read_when_the_speculator_is_made(monkeypatch):
    monkeypatch.setenv(FOLD_ENV, "0")
    head = ToyPerTokenHead(VOCAB, HIDDEN)
    off = DraftHeadSpeculator(head, max_draft_tokens=2, feature_size=HIDDEN)
    monkeypatch.setenv(FOLD_ENV, "1")
    assert off.fold_catch_up is False
    assert DraftHeadSpeculator(head, max_draft_tokens=2, feature_size=HIDDEN).fold_catch_up is True
    assert fold_enabled({}) and not fold_enabled({FOLD_ENV: "off"}) and fold_enabled({FOLD_ENV: "1"})


def test_heads_without_a_fused_call_use_the_unfolded_path():
    class StepOnlyHead:
        kind = ToyPerTokenHead.kind
        block_size, resumes_after_gap = 1, False

        def __init__(self):
            self.inner = ToyPerTokenHead(VOCAB, HIDDEN)
            self.draft_step, self.draft_catch_up = self.inner.draft_step, self.inner.draft_catch_up
            self.reset = self.inner.reset

    spec = DraftHeadSpeculator(
        StepOnlyHead(), max_draft_tokens=2, feature_size=HIDDEN, min_draft_prob=0.0, fold_catch_up=True
    )
    assert spec.fold_catch_up is False
    assert _drive(spec, steps=3) == _drive(_spec(fold=True, window=2, seed=0), steps=3)
    assert spec.counters.catch_ups == 4 and spec.counters.fused == 0


def test_rejects_an_empty_window():
    with pytest.raises(ValueError):
        _spec(window=0)


def test_commit_needs_a_row_per_token():
    for fold in (True, False):
        with pytest.raises(ValueError):
            _spec(fold=fold).commit([1, 2, 3], _rows(2, 0), 0)


def test_folded_commit_keeps_its_own_copy_of_the_rows():
    spec = _spec(fold=True)
    buffer = _rows(2, 0)
    spec.commit([1, 2], buffer, 0)
    expected = _spec(fold=True)
    expected.commit([1, 2], buffer.clone(), 0)
    buffer.zero_()  # a target reusing its output buffer
    ctx = _ctx([1, 2, 3], _rows(1, 1)[0])
    assert spec.propose(ctx) == expected.propose(ctx)
    assert torch.equal(spec.head.draft_step(4, _rows(1, 2)[0], 3)[0], expected.head.draft_step(4, _rows(1, 2)[0], 3)[0])


# -- bounded catch-up ------------------------------------------------------------------------
def _park_then_propose(spec, parked: int):
    """Prefill 3 tokens, then ``parked`` one-token plain commits (a parked governor), then one
    proposal; returns the head's rows written by that proposal's call."""
    gen = torch.Generator().manual_seed(5)
    history = [int(t) for t in torch.randint(0, VOCAB, (4,), generator=gen)]
    rows = _rows(parked + 16, 9)
    rows_for = lambda start, n: torch.cat([torch.zeros(1, HIDDEN, dtype=torch.float64), rows])[start : start + n]
    spec.reset()
    spec.commit(history[:-1], rows_for(0, len(history) - 1), 0)
    spec.propose(_ctx(history, rows[len(history) - 2]))
    for _ in range(parked):
        p = len(history) - 1
        spec.commit([history[-1]], rows_for(p, 1), p)
        history.append(int(torch.randint(0, VOCAB, (1,), generator=gen)))
    before = spec.head.rows
    spec.propose(_ctx(history, rows[len(history) - 2]))
    return spec.head.rows - before, history


@pytest.mark.parametrize("fold", [True, False], ids=["fold", "no-fold"])
def test_catch_up_after_a_park_is_bounded(fold):
    spec = DraftHeadSpeculator(ToyPerTokenHead(VOCAB, HIDDEN, seed=3), max_draft_tokens=1, feature_size=HIDDEN,
                               min_draft_prob=0.0, fold_catch_up=fold, catch_up_rows=3)
    rows, history = _park_then_propose(spec, parked=40)
    held, p = spec.head.cache_positions, len(history) - 1
    if fold:  # one call: the 3 newest pending rows and the step; the rest of the park skipped
        assert rows == 4 and spec.counters.skipped_rows == 40 - 3
        assert held[-4:] == [p - 3, p - 2, p - 1, p] and p - 4 not in held
    else:  # each parked commit was a one-row catch-up of its own: nothing to skip
        assert rows == 1 and spec.counters.skipped_rows == 0 and p - 4 in held


def test_folded_commits_keep_the_newest_rows_through_appends_overlaps_and_gaps():
    spec = DraftHeadSpeculator(ToyPerTokenHead(VOCAB, HIDDEN, seed=3), max_draft_tokens=1, feature_size=HIDDEN,
                               min_draft_prob=0.0, fold_catch_up=True, catch_up_rows=3)
    prefill = _rows(10, 1)
    spec.commit(list(range(10)), prefill, 0)  # only the newest 3 rows are kept (7, 8, 9)
    for p in (10, 11):  # plain steps: one row appended, the oldest dropped
        spec.commit([p], _rows(1, p)[0:1], p)
    spec.commit([20, 21], _rows(2, 20), 11)  # a verify's rows from 11 on: the newer rows win
    pending = spec._pending
    assert (pending.start, pending.tokens) == (10, [10, 20, 21]) and spec.counters.skipped_rows == 10
    assert torch.equal(pending.rows[1:], _rows(2, 20))
    long = _rows(6, 30)
    spec.commit(list(range(30, 36)), long, 12)  # overlaps, longer than the bound: its last 3 rows
    pending = spec._pending
    assert (pending.start, pending.tokens) == (15, [33, 34, 35]) and spec.counters.skipped_rows == 15
    assert torch.equal(pending.rows, long[3:])
    long.zero_()  # the kept rows are copies
    assert torch.equal(pending.rows, _rows(6, 30)[3:])
    calls = spec.counters.catch_ups
    spec.commit([37, 38], _rows(2, 40), 30)  # a gap: the pending rows before it are dropped unseen
    assert spec.counters.catch_ups == calls and spec.counters.skipped_rows == 18
    assert (spec._pending.start, spec._pending.tokens) == (30, [37, 38])


def test_unbounded_catch_up_carries_every_parked_row():
    spec = DraftHeadSpeculator(ToyPerTokenHead(VOCAB, HIDDEN, seed=3), max_draft_tokens=1, feature_size=HIDDEN,
                               min_draft_prob=0.0, fold_catch_up=True, catch_up_rows=None)
    rows, _ = _park_then_propose(spec, parked=40)
    assert rows == 41 and spec.counters.skipped_rows == 0


def test_catch_up_rows_must_be_positive():
    with pytest.raises(ValueError, match="catch_up_rows"):
        DraftHeadSpeculator(ToyPerTokenHead(VOCAB, HIDDEN), max_draft_tokens=1, feature_size=HIDDEN, catch_up_rows=0)


# -- the gate on compact (draft-vocabulary) logits -----------------------------------------------
class _FixedHead:
    """Always the same logits over draft ids [3, 7, 9] of a 12-token vocabulary; ``compact``
    offers them as [K] (``draft_vocab_ids``), else only as the protocol's [vocab]."""

    vocab_size = 12

    def __init__(self, small, *, compact: bool):
        self.small = torch.tensor(small, dtype=torch.float32)
        ids = torch.tensor([3, 7, 9])
        self.full = torch.full((12,), float("-inf"))
        self.full[ids] = self.small
        if compact:
            self.draft_vocab_ids = ids

    def draft_step(self, token, h_prev, pos, *, compact=False):
        return (self.small.clone() if compact else self.full.clone()), h_prev

    def draft_catch_up(self, tokens, h_rows, start_pos):
        pass

    def reset(self):
        pass


def _fixed_proposal(small, *, compact, pmin=0.0, vocab=12, adjust=None, lookback=0):
    import attrs

    spec = DraftHeadSpeculator(_FixedHead(small, compact=compact), max_draft_tokens=1, feature_size=HIDDEN,
                               min_draft_prob=pmin, fold_catch_up=False)
    ctx = attrs.evolve(_ctx([1, 2], torch.zeros(HIDDEN), adjust=adjust, vocab=vocab), adjust_lookback=lookback)
    return spec.propose(ctx)


_PENALISE_9 = lambda logits, preceding: torch.where(torch.arange(logits.shape[0]) == 9, logits - 3.0, logits)  # noqa: E731


@pytest.mark.parametrize("case, drafts", [
    (dict(small=[1.0, 5.0, 5.0]), [7]),  # a tie: the lowest id wins either way
    (dict(small=[1.0, 5.0, 6.0], vocab=8), [7]),  # a padded vocabulary: 9 is never proposed
    (dict(small=[1.0, 5.0, 6.0], vocab=3), []),  # no draft id inside the vocabulary: no draft
    (dict(small=[2.0, 0.5, 0.0], pmin=0.70), [3]),  # top-1 probability 0.7361 over the three
    (dict(small=[2.0, 0.5, 0.0], pmin=0.74), []),
    (dict(small=[1.0, 5.0, 6.0], lookback=4, adjust=_PENALISE_9), [7]),  # an adjustment that reads tokens
    (dict(small=[1.0, 5.0, 6.0], lookback=0), [9]),  # lookback 0: no adjustment to apply
])
def test_the_gate_on_compact_logits_is_the_full_vocabulary_gate(case, drafts):
    assert _fixed_proposal(compact=False, **case) == drafts
    assert _fixed_proposal(compact=True, **case) == drafts


@pytest.mark.parametrize("fold", [True, False])
def test_a_prefill_after_a_reused_prefix_does_not_feed_its_missing_row(fold):
    # after a reused KV prefix the loop commits the prompt's new part from `reuse` on, its first
    # row zeros (that row's predecessor was never computed): the head starts one position later
    spec = _spec(fold=fold, pmin=0.0)
    rows = torch.cat([torch.zeros(1, HIDDEN, dtype=torch.float64), _rows(3, 0)])  # [4, F]
    spec.commit([5, 6, 7, 8], rows, 16)
    spec.propose(_ctx([0] * 20 + [9], _rows(1, 1)[0]))
    assert spec.head.cache_positions[:4] == [17, 18, 19, 20] and spec.counters.skipped_rows == 1
    # only the first commit of a sequence: a zero row later is fed as given
    spec.commit([9, 3], torch.zeros(2, HIDDEN, dtype=torch.float64), 20)
    assert spec.counters.skipped_rows == 1
    spec.reset()  # a new sequence from position 0: its row 0 is the head's own business
    spec.commit([1, 2], torch.zeros(2, HIDDEN, dtype=torch.float64), 0)
    assert spec.counters.skipped_rows == 1


def test_a_gap_before_the_newest_catch_up_rows_leaves_the_same_drafts_as_every_commit():
    """A verify that landed two drafts, then plain steps: told every commit, or only the last
    ``catch_up_rows`` after a gap, the head makes the same calls and the next proposal drafts
    the same (the bound drops the older rows either way)."""
    results = []
    for withheld in (False, True):
        spec = DraftHeadSpeculator(ToyPerTokenHead(VOCAB, HIDDEN, seed=3), max_draft_tokens=3, feature_size=HIDDEN,
                                   min_draft_prob=0.0, fold_catch_up=True, catch_up_rows=4)
        rows = _rows(64, 7)  # rows[p]: the trunk row of position p
        history = [int(t) % VOCAB for t in range(1, 41)]
        spec.commit(history[:10], torch.cat([torch.zeros(1, HIDDEN, dtype=torch.float64), rows[:9]]), 0)
        spec.propose(_ctx(history[:11], rows[9]))
        spec.commit(history[10:13], rows[9:12], 10)  # `last` and two accepted drafts
        for p in range(13, 40):  # parked plain steps; the probe comes at 40
            if not withheld or p >= 40 - 4:
                spec.commit([history[p]], rows[p - 1 : p], p)
        drafts = spec.propose(_ctx(history + [5], rows[39]))
        results.append((drafts, list(spec.head.cache_positions), spec.counters.catch_ups, spec.counters.fused))
    assert results[0] == results[1] and len(results[0][0]) == 3


# -- the chain: the gate and the chain limit; the confidences ride along -----------------------


class ScriptedHead:
    """A per-token head that drafts ``truth(p)`` for position p, sure (a sharp peak) where
    ``sure(p)`` and unsure (a slight lead over nine rivals) elsewhere; it counts its calls."""

    from tsspec.protocols import DraftHeadKind as _Kind

    kind = _Kind.PER_TOKEN
    block_size = 1
    resumes_after_gap = False
    vocab_size = VOCAB

    def __init__(self, truth, sure):
        self.truth, self.sure, self.calls = truth, sure, 0

    def draft_step(self, token, h_prev, position):
        self.calls += 1
        logits = torch.zeros(VOCAB, dtype=torch.float64)
        logits[:10] = 1.5  # rivals
        logits[self.truth(position + 1)] = 12.0 if self.sure(position + 1) else 2.0
        return logits, torch.zeros(HIDDEN, dtype=torch.float64)

    def draft_catch_up(self, tokens, rows, start):
        pass

    def reset(self):
        pass


def test_the_gate_and_the_chain_limit_decide_the_chain_and_the_confidences_ride_along():
    from tsspec.protocols import Proposal

    head = ScriptedHead(truth=lambda p: (p * 7) % 30 + 10, sure=lambda p: p < 20)
    spec = DraftHeadSpeculator(head, max_draft_tokens=8, feature_size=HIDDEN, fold_catch_up=False,
                               min_draft_prob=0.75)
    history = list(range(10, 20))  # last token at position 9: positions 10.. are sure up to 19
    sure = spec.propose(_ctx(history, _rows(1, 0)[0], max_tokens=6))
    assert isinstance(sure, Proposal) and len(sure) == 6 and min(sure.confidence) > 0.9
    assert list(sure) == [(p * 7) % 30 + 10 for p in range(10, 16)]
    calls = head.calls
    unsure = spec.propose(_ctx(list(range(10, 30)), _rows(1, 0)[0], max_tokens=6))  # position 20 on: unsure
    assert unsure == [] and head.calls == calls + 1  # the gate stops the chain at its first token
    crossing = spec.propose(_ctx(list(range(10, 27)), _rows(1, 0)[0], max_tokens=6))  # sure 17..19 only
    assert list(crossing) == [(p * 7) % 30 + 10 for p in range(17, 20)] and len(crossing.confidence) == 3
    limited = DraftHeadSpeculator(head, max_draft_tokens=8, feature_size=HIDDEN, fold_catch_up=False,
                                  min_draft_prob=0.75, chain_limit=2)
    assert len(limited.propose(_ctx(history, _rows(1, 0)[0], max_tokens=6))) == 2  # the file's chain limit
