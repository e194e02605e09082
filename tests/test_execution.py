"""The shared loop: lossless for every fake speculator, every rollback path and acceptance
count, greedy and seeded sampling; edges (context limit, budget, stop tokens)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tsspec.protocols import DraftContext
from tsspec.runtime.execution import MAX_FAULTS, validate_proposal
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import (
    ADVERSARIAL_MODES,
    AdversarialSpeculator,
    OracleSpeculator,
    RandomSpeculator,
    ToyTarget,
    assert_lossless,
    plain_tokens,
)

SPEC = SpeculationOptions(adaptive=False)


class FixedSpeculator:
    """Proposes the plain continuation with exactly ``accept`` right tokens, then wrong ones."""

    name = "fixed"
    default_min_draft_prob = min_draft_prob = 0.0
    needs_hidden_state = True
    handles_own_prefill = False
    can_arm_after_prefix_reuse = True

    def __init__(self, sequence, accept: int, k: int, vocab: int):
        self.sequence, self.accept, self.max_draft_tokens, self.vocab = sequence, accept, k, vocab
        self.commits: list[tuple[list[int], torch.Tensor | None, int]] = []

    def propose(self, ctx: DraftContext):
        p = ctx.position
        out = list(self.sequence[p + 1 : p + 1 + ctx.max_tokens])
        for i in range(self.accept, len(out)):
            out[i] = (out[i] + 1) % self.vocab
        return out

    def commit(self, tokens, hidden_rows, start_pos):
        self.commits.append((list(tokens), hidden_rows, start_pos))

    def reset(self):
        self.commits.clear()

    def close(self):
        pass


SAMPLINGS = [None, SamplingParams(temperature=0.9, top_k=12, top_p=0.95, seed=11)]


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("recurrent", [True, False])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "sampled"])
@pytest.mark.parametrize("accept", range(0, 5))
def test_rollback_at_every_acceptance_count(per_row, recurrent, sampling, accept):
    prompt = [3, 1, 4, 1, 5]
    ref = prompt + plain_tokens(ToyTarget(seed=2, recurrent=recurrent), prompt, 30, sampling)

    def make_target():
        return ToyTarget(seed=2, per_row_snapshots=per_row, recurrent=recurrent)

    _, spec = assert_lossless(make_target, lambda t: FixedSpeculator(ref, accept, 4, 32), prompt,
                              max_tokens=30, sampling=sampling, options=SPEC)
    assert spec.stats.verify_steps > 0
    # every draft gets its first `accept` tokens accepted (the last one may be cut by the budget)
    for i in range(accept):
        assert spec.stats.accepted_per_position[i] >= spec.stats.drafts - 1
    expected_mode = "committed" if (per_row and recurrent) else ("rewound" if not recurrent else "reforward")
    if accept < 4:
        assert expected_mode in spec.stats.rollback_modes


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 50),
    per_row=st.booleans(),
    recurrent=st.booleans(),
    prompt=st.lists(st.integers(0, 31), min_size=1, max_size=12),
    kind=st.sampled_from(["oracle", "random", "adversarial"]),
    corrupt=st.floats(0.0, 1.0),
    sampled=st.booleans(),
    window=st.integers(1, 8),
)
def test_lossless_property(seed, per_row, recurrent, prompt, kind, corrupt, sampled, window):
    sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=seed) if sampled else None

    def make_target():
        return ToyTarget(seed=seed, per_row_snapshots=per_row, recurrent=recurrent, max_context=64)

    def make_spec(target):
        if kind == "oracle":
            return OracleSpeculator.from_plain_run(make_target(), prompt, 24, sampling=sampling,
                                                   corrupt=corrupt, max_draft_tokens=window, seed=seed)
        if kind == "random":
            return RandomSpeculator(32, max_draft_tokens=window, seed=seed)
        return AdversarialSpeculator(32, "mixed", sequence=prompt + plain_tokens(make_target(), prompt, 24, sampling))

    assert_lossless(make_target, make_spec, prompt, max_tokens=24, sampling=sampling,
                    options=SpeculationOptions(adaptive=False, draft=window))


@pytest.mark.parametrize("mode", ADVERSARIAL_MODES)
def test_adversarial_modes_are_lossless_and_counted(mode):
    prompt = [1, 2, 3, 1, 2, 3]
    seq = prompt + plain_tokens(ToyTarget(seed=4), prompt, 20)
    _, spec = assert_lossless(lambda: ToyTarget(seed=4), lambda t: AdversarialSpeculator(32, mode, sequence=seq, delay_s=0.0),
                              prompt, max_tokens=20, options=SPEC)
    if mode in ("out_of_vocab", "negative", "too_many", "wrong_type", "floats", "raise_propose", "raise_commit"):
        assert spec.stats.faults == MAX_FAULTS and spec.stats.speculator_parked
    if mode == "none":
        assert spec.stats.faults == 0


def test_context_limit_truncates_drafts():
    prompt = [1, 2, 3, 4]
    make = lambda: ToyTarget(seed=5, max_context=12)  # noqa: E731
    seq = prompt + plain_tokens(make(), prompt, 50)
    assert len(seq) <= 12 + 1  # generation stops when the context is full
    _, spec = assert_lossless(make, lambda t: FixedSpeculator(seq + [0] * 20, 8, 8, 32), prompt, max_tokens=50, options=SPEC)
    assert len(spec.tokens) == len(seq) - len(prompt)


def test_budget_caps_drafts():
    prompt = [7, 7, 7]
    seq = prompt + plain_tokens(ToyTarget(seed=6), prompt, 40)
    for budget in (1, 2, 5, 9):
        _, spec = assert_lossless(lambda: ToyTarget(seed=6), lambda t: FixedSpeculator(seq, 8, 8, 32), prompt,
                                  max_tokens=budget, options=SPEC)
        assert len(spec.tokens) == budget


def test_stop_token_inside_an_accepted_draft():
    prompt = [2, 9, 2, 9]
    seq = prompt + plain_tokens(ToyTarget(seed=8), prompt, 30)
    stop = seq[len(prompt) + 5]  # a token the plain run emits 6th
    first = seq[len(prompt):].index(stop)
    make = lambda: ToyTarget(seed=8)  # noqa: E731
    plain_t, spec_t = make(), make()
    plain = generate(plain_t, prompt, SpeculationOptions(enabled=False), max_tokens=30, stop_tokens=[stop])
    spec = generate(spec_t, prompt, SPEC, max_tokens=30, stop_tokens=[stop],
                    speculator=FixedSpeculator(seq, 8, 8, 32))
    assert plain.tokens == spec.tokens == seq[len(prompt): len(prompt) + first + 1]
    assert spec.finish_reason == "stop"
    assert plain_t.state_fingerprint()[0] == spec_t.state_fingerprint()[0]


def test_commit_contract_hidden_row_shift():
    """Row k of committed hidden_rows is the row that predicted tokens[k]."""
    prompt = [5, 6, 7, 8]
    seq = prompt + plain_tokens(ToyTarget(seed=9), prompt, 12)
    spec = FixedSpeculator(seq, 2, 4, 32)
    target = ToyTarget(seed=9)
    gen = generate(target, prompt, SPEC, max_tokens=12, speculator=spec)
    committed, rows_all = [], []
    for tokens, rows, start in spec.commits:
        assert start == len(committed)
        committed += tokens
        rows_all.append(rows)
    rows = torch.cat(rows_all)
    assert committed == (prompt + gen.tokens)[: len(committed)]
    # recompute every position's hidden row with a plain forward of the committed sequence
    ref = ToyTarget(seed=9)
    _, hidden = ref.spec_forward(committed, all_logits_rows=True, want_hidden=True)
    assert torch.equal(rows[0], torch.zeros_like(rows[0]))
    assert torch.equal(rows[1:], hidden[:-1])


def test_zero_drafts_is_a_plain_step_that_commits():
    class Empty(FixedSpeculator):
        def propose(self, ctx):
            return []

    prompt = [1, 2, 3]
    spec = Empty([], 0, 4, 32)
    gen = generate(ToyTarget(seed=1), prompt, SPEC, max_tokens=10, speculator=spec)
    assert gen.stats.verify_steps == 0 and gen.stats.plain_steps == 9
    assert sum(len(t) for t, _, _ in spec.commits) == len(prompt) + 9


def test_prefix_reuse_rewinds_and_respects_arming():
    from tsspec.runtime.execution import SpeculativeExecution
    from tsspec.runtime.sampling import Sampler

    target = ToyTarget(seed=3, recurrent=False)
    spec = FixedSpeculator([], 0, 4, 32)
    spec.can_arm_after_prefix_reuse = False
    ex = SpeculativeExecution(target, Sampler(), vocab_size=32, speculator=spec, window=4)
    first = ex.run([1, 2, 3, 4, 5], 6)
    calls = target.forward_rows
    second = ex.run([1, 2, 3, 4, 5, 9], 6)  # a longer prompt sharing the first five tokens
    assert target.forward_rows - calls < 6 + 6  # the shared prefix was not forwarded again
    assert not ex._armed  # a speculator that cannot arm after reuse is not armed
    assert second == plain_tokens(ToyTarget(seed=3, recurrent=False), [1, 2, 3, 4, 5, 9], 6)
    assert first == plain_tokens(ToyTarget(seed=3, recurrent=False), [1, 2, 3, 4, 5], 6)


def test_validate_proposal():
    import numpy as np

    assert validate_proposal([1, np.int64(2)], 4, 10) == ([1, 2], None)
    assert validate_proposal([1] * 5, 4, 10) == ([], "too_many_tokens")
    assert validate_proposal([True], 4, 10) == ([], "bad_id")
    assert validate_proposal([1.0], 4, 10) == ([], "bad_id")
    assert validate_proposal("ab", 4, 10) == ([], "bad_type")
    assert validate_proposal(None, 4, 10) == ([], None)
    assert validate_proposal([-1], 4, 10) == ([], "out_of_vocab")
    assert validate_proposal(iter([1]), 4, 10) == ([], "bad_type")


def test_the_checks_give_the_same_answers_on_plain_lists_proposals_and_their_subclasses():
    """A plain list or Proposal of ints in range passes without running the proposal's code;
    anything else in them gets the general checks' answer, and a subclass (whose own code may
    run) always takes the general checks."""
    import numpy as np

    from tsspec.protocols import Proposal
    from tsspec.runtime.proposal import proposal_confidence

    class Sub(Proposal):
        def __len__(self):
            return 1  # lies about its length

    cases = [([3, 4], ([3, 4], None)), ([], ([], None)), ([3, 10], ([], "out_of_vocab")),
             ([3, True], ([], "bad_id")), ([True, 99], ([], "bad_id")), ([np.int64(4), 3], ([4, 3], None)),
             ([1] * 5, ([], "too_many_tokens")), ([2.0], ([], "bad_id"))]
    for items, want in cases:
        assert validate_proposal(list(items), 4, 10) == want
        assert validate_proposal(Proposal(items, confidence=[0.5] * len(items)), 4, 10) == want
    assert validate_proposal(Sub([1, 2]), 4, 10) == ([], "bad_type")  # iterates past its claimed length
    for values, want in (([0.5, 1.0], ([0.5, 1.0], None)), ([0.5, 1], ([0.5, 1.0], None)), (None, (None, None)),
                         ([0.5, float("nan")], (None, "bad_confidence")), ([0.5, 1.5], (None, "bad_confidence")),
                         ([0.5], (None, "bad_confidence")), ([0.5, True], (None, "bad_confidence"))):
        assert proposal_confidence(Proposal([1, 2], confidence=values), 2) == want


def test_accept_names_accepted_corrected_and_bonus_tokens():
    from tsspec.runtime.execution import accept

    rows = [5, 6, 9]
    drawn_rows = []

    def draw(i):
        drawn_rows.append(i)
        return rows[i]

    assert accept(draw, [5, 6]) == [5, 6, 9]  # two accepted, bonus 9
    assert accept(lambda i: [5, 7, 9][i], [5, 6]) == [5, 7]  # one accepted, 7 corrects 6
    assert accept(lambda i: [4][i], [5, 6]) == [4]  # none accepted
    drawn_rows.clear()
    accept(draw, [1, 2])
    assert drawn_rows == [0]  # rows after the first rejection are never drawn


def test_draft_context_carries_the_window_and_the_preceding_tokens():
    seen = []

    class Spy(FixedSpeculator):
        def propose(self, ctx):
            seen.append((ctx.window, ctx.max_tokens, list(ctx.preceding([7])[-3:])))
            return super().propose(ctx)

    prompt = [3, 1, 4, 1, 5]
    ref = prompt + plain_tokens(ToyTarget(seed=2), prompt, 12)
    generate_opts = SpeculationOptions(adaptive=False, draft=3)
    out = generate(ToyTarget(seed=2), prompt, generate_opts, max_tokens=12, speculator=Spy(ref, 2, 8, 32))
    assert out.tokens == ref[len(prompt):]
    assert seen and all(window == 3 and max_tokens <= 3 for window, max_tokens, _ in seen)
    assert seen[0][2] == [prompt[-1], ref[len(prompt)], 7]  # history (ends with last) then drafts


def test_a_proposal_with_confidence_is_sized_by_it_and_bad_confidence_is_a_fault():
    from tsspec.protocols import Proposal
    from tsspec.runtime.proposal import proposal_confidence

    prompt = [3, 1, 4, 1, 5]
    ref = prompt + plain_tokens(ToyTarget(seed=2), prompt, 24)

    class Confident(FixedSpeculator):
        confidence = 0.9

        def propose(self, ctx):
            drafts = super().propose(ctx)
            return Proposal(drafts, confidence=[self.confidence] * len(drafts)) if drafts else drafts

    spec = Confident(ref, 4, 8, 32)
    out = generate(ToyTarget(seed=2), prompt, SpeculationOptions(draft=4), max_tokens=24, speculator=spec)
    assert out.tokens == ref[len(prompt):] and out.stats.draft_tokens > 0 and out.stats.faults == 0
    spec = Confident(ref, 4, 8, 32)
    spec.confidence = 1.5
    out = generate(ToyTarget(seed=2), prompt, SpeculationOptions(draft=4), max_tokens=24, speculator=spec)
    assert out.tokens == ref[len(prompt):] and out.stats.fault_kinds.get("bad_confidence", 0) >= 1
    assert out.stats.draft_tokens == 0

    class Raises(list):
        @property
        def confidence(self):
            raise RuntimeError("no")

    assert proposal_confidence(Raises([1]), 1) == (None, "bad_confidence")
    assert proposal_confidence([1], 1) == (None, None)
