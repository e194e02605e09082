"""Reliability of the shared loop against untrusted speculators: whatever a speculator does in
``propose`` or ``commit`` (raise, return garbage, lie about lengths, vandalise the tensors it is
given, take too long), generation completes with exactly the plain-decoding output; the fault is
counted, logged once, and after ``MAX_FAULTS`` the speculator is parked for the sequence.

Everything runs on the exact float64 ``ToyTarget``, so "identical" means token for token.
"""

from __future__ import annotations

import itertools
import logging
import math

import numpy as np
import pytest
import torch

from tsspec.runtime import execution
from tsspec.runtime.execution import SpeculativeExecution
from tsspec.runtime.proposal import (
    BAD_ID,
    BAD_TYPE,
    COMMIT_RAISED,
    MAX_FAULTS,
    OUT_OF_VOCAB,
    PROPOSE_RAISED,
    TOO_MANY,
    validate_proposal,
)
from tsspec.runtime.generation import generate
from tsspec.runtime.governor import SpeculationCostGovernor
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import Sampler, SamplingParams
from tsspec.testing import ADVERSARIAL_MODES, AdversarialSpeculator, ToyTarget, assert_lossless, plain_tokens

VOCAB = 32  # ToyTarget's default vocabulary
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
MAX_TOKENS = 40
TARGET_SEED = 2  # a varied greedy continuation
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.8, top_k=20, top_p=0.95, repeat_penalty=1.1, seed=7)
TRUNKS = {  # the three rollback regimes of the loop
    "snapshots": dict(per_row_snapshots=True),
    "reforward": dict(per_row_snapshots=False),
    "kv": dict(recurrent=False),
}
NO_GOVERNOR = SpeculationOptions(adaptive=False)  # faults, not the governor, must decide here
GENERATION_TIME_BOUND_S = 20  # a hang shows up as a failure, not a stuck test run


def _target(trunk: str = "reforward") -> ToyTarget:
    return ToyTarget(seed=TARGET_SEED, **TRUNKS[trunk])


_PLAIN: dict[tuple, list[int]] = {}


def _plain(trunk: str = "reforward", sampling: SamplingParams = GREEDY) -> list[int]:
    key = (trunk, sampling)
    if key not in _PLAIN:
        _PLAIN[key] = plain_tokens(_target(trunk), PROMPT, MAX_TOKENS, sampling)
    return _PLAIN[key]



@pytest.fixture(autouse=True)
def _fresh_fault_log(monkeypatch):
    """The loop logs a speculator's first fault once per process; each test starts afresh."""
    monkeypatch.setattr(execution, "_logged_faults", set())


@pytest.fixture(autouse=True)
def _time_bound():
    """SIGALRM turns a hang (e.g. an endless proposal iterator) into a test failure."""
    import signal

    def _expired(signum, frame):
        raise TimeoutError(f"generation did not finish within {GENERATION_TIME_BOUND_S} s")

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(GENERATION_TIME_BOUND_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


class Scripted:
    """A speculator whose ``propose`` is a function of (self, ctx); everything else is tame.

    ``oracle`` holds prompt + plain continuation, so a script can return the right answer in an
    unusual container (numpy, torch) and show that it is accepted, not merely tolerated."""

    name = "scripted"
    default_min_draft_prob = 0.0
    min_draft_prob = 0.0
    needs_hidden_state = False
    handles_own_prefill = False
    can_arm_after_prefix_reuse = True

    def __init__(self, script, *, name: str | None = None, max_draft_tokens: int = 4, commit_raises=False):
        self.script = script
        self.name = name or self.name
        self.max_draft_tokens = max_draft_tokens
        self.commit_raises = commit_raises
        self.oracle = list(PROMPT) + _plain()
        self.proposals = 0
        self.commits = 0

    def truth(self, ctx, n: int | None = None) -> list[int]:
        n = min(ctx.max_tokens, self.max_draft_tokens) if n is None else n
        return self.oracle[ctx.position + 1 : ctx.position + 1 + n]

    def propose(self, ctx):
        self.proposals += 1
        return self.script(self, ctx)

    def commit(self, tokens, hidden_rows, start_pos):
        self.commits += 1
        if self.commit_raises:
            raise RuntimeError("commit exploded")

    def reset(self):
        pass

    def close(self):
        pass


def _run(speculator, *, trunk: str = "reforward", sampling: SamplingParams = GREEDY, options=NO_GOVERNOR, **kw):
    return generate(_target(trunk), PROMPT, options, max_tokens=MAX_TOKENS, sampling=sampling,
                    speculator=speculator, **kw)


# -- garbage proposals --------------------------------------------------------------------------


class LyingLength:
    """Claims two items, yields forever: a bounded length must bound the iteration too."""

    def __len__(self):
        return 2

    def __iter__(self):
        return itertools.repeat(1)


class RaisingIndex:
    """An 'integer' whose conversion blows up with something other than TypeError."""

    def __index__(self):
        raise RuntimeError("no index for you")


class RaisingIterator:
    def __len__(self):
        return 1

    def __iter__(self):
        raise RuntimeError("iteration exploded")


class RaisingLength:
    def __len__(self):
        raise RuntimeError("length exploded")

    def __iter__(self):
        return iter([1])


class RaisingGetattr:
    """hasattr() only swallows AttributeError; this raises something else on any lookup."""

    def __getattr__(self, name):
        raise RuntimeError(f"no attribute {name}")


GARBAGE = {  # name -> (proposal, fault kind counted)
    "ids past the vocabulary": (lambda s, c: [VOCAB, VOCAB + 7], OUT_OF_VOCAB),
    "negative id": (lambda s, c: [-1], OUT_OF_VOCAB),
    "huge int id": (lambda s, c: [10**30], OUT_OF_VOCAB),
    "a million tokens": (lambda s, c: [0] * 1_000_000, TOO_MANY),
    "more than max_tokens": (lambda s, c: [1] * (c.max_tokens + 1), TOO_MANY),
    "a string": (lambda s, c: "not a list", BAD_TYPE),
    "bytes": (lambda s, c: b"\x01\x02", BAD_TYPE),
    "a dict": (lambda s, c: {1: 2}, BAD_TYPE),
    "an int": (lambda s, c: 7, BAD_TYPE),
    "a float": (lambda s, c: 1.0, BAD_TYPE),
    "a generator": (lambda s, c: (t for t in [1]), BAD_TYPE),
    "float ids": (lambda s, c: [1.5, 2.0], BAD_ID),
    "NaN ids": (lambda s, c: [float("nan")], BAD_ID),
    "inf ids": (lambda s, c: [math.inf], BAD_ID),
    "bool ids": (lambda s, c: [True], BAD_ID),
    "None ids": (lambda s, c: [None, None], BAD_ID),
    "nested lists": (lambda s, c: [[1]], BAD_ID),
    "numpy floats": (lambda s, c: np.array([1.0, 2.0]), BAD_ID),
    "torch floats": (lambda s, c: torch.tensor([1.0]), BAD_ID),
    "numpy NaN": (lambda s, c: np.array([np.nan]), BAD_ID),
    "length lies, iterator endless": (lambda s, c: LyingLength(), BAD_TYPE),
    "__index__ raises": (lambda s, c: [RaisingIndex()], BAD_ID),
    "__iter__ raises": (lambda s, c: RaisingIterator(), BAD_TYPE),
    "__len__ raises": (lambda s, c: RaisingLength(), BAD_TYPE),
    "__getattr__ raises": (lambda s, c: RaisingGetattr(), BAD_TYPE),
    "propose raises": (lambda s, c: (_ for _ in ()).throw(ValueError("propose exploded")), PROPOSE_RAISED),
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_garbage_proposal_costs_speed_never_a_token(case, caplog):
    script, kind = GARBAGE[case]
    spec = Scripted(script, name=f"garbage-{case}")
    with caplog.at_level(logging.WARNING, logger="tsspec.execution"):
        result = _run(spec)
    assert result.tokens == _plain()
    stats = result.stats
    assert stats.fault_kinds.get(kind, 0) >= 1, stats.fault_kinds
    assert stats.faults == sum(stats.fault_kinds.values()) >= 1
    # every proposal faults, so the speculator is parked after MAX_FAULTS of them
    assert stats.speculator_parked and spec.proposals == MAX_FAULTS
    assert stats.draft_tokens == 0
    first_fault = [r for r in caplog.records if "output is unaffected" in r.getMessage()]
    assert len(first_fault) == 1 and spec.name in first_fault[0].getMessage()


@pytest.mark.parametrize("trunk", sorted(TRUNKS))
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_garbage_in_every_trunk_regime_and_sampler(trunk, sampling):
    """Every second proposal is right (accepted), the others cycle through the garbage: the
    good path and the fault path interleave in one sequence, in each rollback regime."""
    kinds = sorted(GARBAGE)
    oracle = list(PROMPT) + _plain(trunk, sampling)

    def script(self, ctx):
        if self.proposals % 2:
            return oracle[ctx.position + 1 : ctx.position + 1 + min(ctx.max_tokens, 4)]
        return GARBAGE[kinds[(self.proposals // 2) % len(kinds)]][0](self, ctx)

    result = _run(Scripted(script), trunk=trunk, sampling=sampling)
    assert result.tokens == _plain(trunk, sampling)
    assert result.stats.faults >= 1 and result.stats.accepted_tokens >= 1


VALID_CONTAINERS = {  # the right answer in containers the contract does not forbid
    "numpy int64": lambda s, c: np.array(s.truth(c), dtype=np.int64),
    "list of numpy int32": lambda s, c: [np.int32(t) for t in s.truth(c)],
    "torch long": lambda s, c: torch.tensor(s.truth(c), dtype=torch.long),
    "tuple": lambda s, c: tuple(s.truth(c)),
    "plain list": lambda s, c: list(s.truth(c)),
}


@pytest.mark.parametrize("case", sorted(VALID_CONTAINERS))
def test_integer_containers_are_accepted_not_faulted(case):
    result = _run(Scripted(VALID_CONTAINERS[case]))
    assert result.tokens == _plain()
    assert result.stats.faults == 0
    assert result.stats.accepted_tokens == result.stats.draft_tokens > 0


def test_none_and_empty_are_plain_steps_not_faults():
    for script in (lambda s, c: None, lambda s, c: [], lambda s, c: ()):
        result = _run(Scripted(script))
        assert result.tokens == _plain()
        assert result.stats.faults == 0 and not result.stats.speculator_parked
        assert result.stats.plain_steps == result.stats.steps


@pytest.mark.parametrize(
    "raw,kind",
    [
        (LyingLength(), BAD_TYPE),
        ([RaisingIndex()], BAD_ID),
        (RaisingIterator(), BAD_TYPE),
        (RaisingLength(), BAD_TYPE),
        (RaisingGetattr(), BAD_TYPE),
    ],
    ids=["lying-length", "raising-index", "raising-iter", "raising-len", "raising-getattr"],
)
def test_validate_proposal_is_total(raw, kind):
    """The validator itself never raises and never loops past the claimed length."""
    assert validate_proposal(raw, 8, VOCAB) == ([], kind)


# -- commit / reset faults, parking -------------------------------------------------------------


@pytest.mark.parametrize("trunk", sorted(TRUNKS))
def test_commit_raising_is_counted_and_parks(trunk, caplog):
    spec = Scripted(lambda s, c: s.truth(c), name="commit-raiser", commit_raises=True)
    with caplog.at_level(logging.WARNING, logger="tsspec.execution"):
        result = _run(spec, trunk=trunk)
    assert result.tokens == _plain(trunk)
    assert result.stats.fault_kinds.get(COMMIT_RAISED) == MAX_FAULTS
    assert result.stats.speculator_parked
    # parked: no proposal and no commit once the third fault landed
    assert spec.commits == MAX_FAULTS
    logged = [r.getMessage() for r in caplog.records]
    assert sum("commit-raiser" in m and COMMIT_RAISED in m for m in logged) == 1
    assert sum("parked" in m for m in logged) == 1


def test_reset_raising_does_not_take_the_run_down():
    class ResetRaiser(Scripted):
        def reset(self):
            raise RuntimeError("reset exploded")

    result = _run(ResetRaiser(lambda s, c: s.truth(c), name="reset-raiser"))
    assert result.tokens == _plain()
    assert result.stats.faults >= 1


def test_close_raising_keeps_the_output():
    class CloseRaiser(Scripted):
        def close(self):
            raise RuntimeError("close exploded")

    result = _run(CloseRaiser(lambda s, c: s.truth(c)))
    assert result.tokens == _plain() and result.stats.accepted_tokens > 0


def test_parked_for_the_sequence_only():
    """Parking lasts one sequence: the next run on the same execution arms the speculator again
    (faults are the speculator's state on that input, not a verdict for the process)."""
    spec = Scripted(lambda s, c: [VOCAB + 1], name="parks-per-sequence")
    target = _target()
    loop = SpeculativeExecution(target, Sampler(GREEDY), vocab_size=VOCAB, speculator=spec, window=4)
    first = loop.run(PROMPT, MAX_TOKENS)
    assert loop.stats.speculator_parked and spec.proposals == MAX_FAULTS
    second = loop.run(PROMPT, MAX_TOKENS)
    assert loop.stats.speculator_parked and spec.proposals == 2 * MAX_FAULTS
    assert first == second == _plain()


def test_faults_below_the_limit_do_not_park():
    """Two faults, then good proposals: counted, logged, not parked, drafts still accepted."""

    def script(self, ctx):
        if self.proposals <= MAX_FAULTS - 1:
            raise RuntimeError("early hiccup")
        return self.truth(ctx)

    result = _run(Scripted(script, name="hiccup"))
    assert result.tokens == _plain()
    assert result.stats.faults == MAX_FAULTS - 1 and not result.stats.speculator_parked
    assert result.stats.accepted_tokens > 0


def test_fault_is_logged_once_per_speculator(caplog):
    spec_name = "logged-once"
    with caplog.at_level(logging.WARNING, logger="tsspec.execution"):
        for _ in range(3):
            _run(Scripted(lambda s, c: "garbage", name=spec_name))
    first_fault = [r for r in caplog.records if "output is unaffected" in r.getMessage()]
    assert len(first_fault) == 1 and spec_name in first_fault[0].getMessage()


@pytest.mark.parametrize("mode", ADVERSARIAL_MODES)
@pytest.mark.parametrize("trunk", sorted(TRUNKS))
def test_adversarial_speculator_is_lossless(mode, trunk):
    """The testing kit's AdversarialSpeculator, every mode, every rollback regime, sampled."""
    sequence = list(PROMPT) + _plain(trunk, SAMPLED)
    assert_lossless(
        lambda: _target(trunk),
        lambda t: AdversarialSpeculator(VOCAB, mode, sequence=sequence, delay_s=0.0),
        PROMPT,
        max_tokens=MAX_TOKENS,
        sampling=SAMPLED,
        options=NO_GOVERNOR,
    )


# -- tensors handed to the speculator ----------------------------------------------------------


class Vandal(Scripted):
    """Writes NaN into every tensor the loop hands it (carry_hidden, hidden_rows)."""

    needs_hidden_state = True

    def propose(self, ctx):
        if ctx.carry_hidden is not None:
            ctx.carry_hidden.fill_(float("nan"))
        return super().propose(ctx)

    def commit(self, tokens, hidden_rows, start_pos):
        super().commit(tokens, hidden_rows, start_pos)
        if hidden_rows is not None:
            hidden_rows.fill_(float("nan"))


@pytest.mark.parametrize("trunk", sorted(TRUNKS))
def test_speculator_vandalising_its_tensors_cannot_change_the_output(trunk):
    result = _run(Vandal(lambda s, c: s.truth(c)), trunk=trunk, sampling=SAMPLED)
    assert result.tokens == _plain(trunk, SAMPLED)


# -- speculators that are not quite speculators ------------------------------------------------


class Minimal:
    """Only what a speculator must do; the attributes with documented defaults are absent
    (can_arm_after_prefix_reuse defaults to False, per the protocol)."""

    name = "minimal"
    max_draft_tokens = 4
    min_draft_prob = 0.0
    default_min_draft_prob = 0.0
    needs_hidden_state = False
    handles_own_prefill = False

    def propose(self, ctx):
        return [1]

    def commit(self, tokens, hidden_rows, start_pos):
        pass

    def reset(self):
        pass

    def close(self):
        pass


def test_optional_speculator_attributes_have_their_defaults():
    result = _run(Minimal())
    assert result.tokens == _plain() and result.stats.drafts > 0
    # the attribute is read when a cached prefix is reused: a second run on the same loop over
    # a trunk that can rewind (pure KV)
    spec = Minimal()
    loop = SpeculativeExecution(_target("kv"), Sampler(GREEDY), vocab_size=VOCAB, speculator=spec, window=4)
    assert loop.run(PROMPT, MAX_TOKENS) == _plain("kv")
    assert loop.run(PROMPT, MAX_TOKENS) == _plain("kv")
    assert loop.stats.drafts == 0  # default False: not armed over a prefix it never saw


@pytest.mark.parametrize("window", [None, "eight", float("nan"), -3, 10**9])
def test_garbage_max_draft_tokens_is_named_before_any_step(window):
    """None (no limit of its own) and a huge limit run; anything else is a ContractError that
    names the member, not a fault some steps later."""
    from tsspec.capabilities import ContractError

    spec = Scripted(lambda s, c: s.truth(c))
    spec.max_draft_tokens = window
    if window is None or window == 10**9:
        assert _run(spec).tokens == _plain()
        return
    with pytest.raises(ContractError, match="max_draft_tokens must be"):
        _run(spec)


# -- draft heads returning garbage (NaN confidences, wrong shapes) -----------------------------


def _head_target(trunk: str = "reforward"):
    from tsspec_model_toy.heads import ToyPerTokenHead

    target = _target(trunk)
    target.draft_head = ToyPerTokenHead.for_target(target, seed=5, logit_scale=6.0)
    return target


def _sabotage(head, kind: str):
    """Replace the head's step output with garbage of one ``kind``."""
    V = head.vocab_size
    real = head.draft_step
    real_fused = head.draft_catch_up_and_step

    def garble(logits, hidden):
        if kind == "nan":
            return torch.full_like(logits, float("nan")), hidden
        if kind == "inf":
            return torch.full_like(logits, float("inf")), torch.full_like(hidden, float("inf"))
        if kind == "wide":  # more logits than the vocabulary: argmax may land outside it
            wide = torch.full((V + 16,), -1e9, dtype=logits.dtype)
            wide[V + 3] = 1e9
            return wide, hidden
        if kind == "2d":
            return logits[None].repeat(2, 1), hidden
        if kind == "raises":
            raise RuntimeError("head exploded")
        raise AssertionError(kind)

    head.draft_step = lambda *a, **k: garble(*real(*a, **k))
    head.draft_catch_up_and_step = lambda *a, **k: garble(*real_fused(*a, **k))


@pytest.mark.parametrize("kind", ["nan", "inf", "wide", "2d", "raises"])
@pytest.mark.parametrize("pmin", [0.0, 0.75])
def test_draft_head_garbage_outputs_are_lossless(kind, pmin):
    pytest.importorskip("tsspec_draft_head")
    from tsspec_draft_head import make_draft_head

    plain = _plain()
    target = _head_target()
    _sabotage(target.draft_head, kind)
    options = SpeculationOptions(spec_type="draft-head", pmin=pmin, adaptive=False)
    result = generate(target, PROMPT, options, max_tokens=MAX_TOKENS, sampling=GREEDY,
                      speculator=make_draft_head(target, options))
    assert result.tokens == plain


# -- the governor against a slow speculator, on a deterministic clock --------------------------

FORWARD_MS = 1.0  # fake cost of one trunk forward (plus a small per-row cost)
ROW_MS = 0.05
SLOW_PROPOSE_MS = 25.0


class FakeClock:
    """Time advances only when the model or the speculator 'work': no wall clock involved."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, ms: float) -> None:
        self.now += ms / 1000.0


class ClockedTarget(ToyTarget):
    def __init__(self, clock: FakeClock, **kw):
        super().__init__(seed=TARGET_SEED, **kw)
        self.clock = clock

    def spec_forward(self, tokens, *, all_logits_rows, want_hidden):
        self.clock.spend(FORWARD_MS + ROW_MS * len(tokens))
        return super().spec_forward(tokens, all_logits_rows=all_logits_rows, want_hidden=want_hidden)


def _clocked_run(propose_ms: float, accuracy_every: int, *, adaptive: bool = True, max_tokens: int = 160):
    clock = FakeClock()
    target = ClockedTarget(clock)
    oracle = list(PROMPT) + plain_tokens(ToyTarget(seed=TARGET_SEED), PROMPT, max_tokens)

    def script(self, ctx):
        clock.spend(propose_ms)
        truth = oracle[ctx.position + 1 : ctx.position + 1 + min(ctx.max_tokens, 4)]
        if self.proposals % accuracy_every:  # wrong drafts except every accuracy_every-th call
            return [(t + 1) % VOCAB for t in truth]
        return truth

    spec = Scripted(script, name="clocked")
    result = generate(target, PROMPT, SpeculationOptions(adaptive=adaptive), max_tokens=max_tokens,
                      speculator=spec, clock=clock)
    assert result.tokens == oracle[len(PROMPT):]
    return result, spec


def test_governor_parks_a_slow_speculator_deterministically():
    slow, spec = _clocked_run(SLOW_PROPOSE_MS, accuracy_every=1_000_000)
    stats = slow.stats
    assert stats.governor_losses >= 1 and stats.governor_parked_steps > 0
    assert spec.proposals < stats.steps / 2  # most steps ran plain, without asking it
    again, _ = _clocked_run(SLOW_PROPOSE_MS, accuracy_every=1_000_000)
    assert (again.stats.governor_losses, again.stats.governor_parked_steps, again.stats.steps) == (
        stats.governor_losses, stats.governor_parked_steps, stats.steps)
    # without the governor the same speculator is asked at every step: the governor did it
    ungoverned, spec_off = _clocked_run(SLOW_PROPOSE_MS, accuracy_every=1_000_000, adaptive=False)
    assert spec_off.proposals > 2 * spec.proposals
    assert ungoverned.stats.decode_ms > stats.decode_ms


def test_governor_keeps_a_cheap_accurate_speculator():
    """The control: a fast, right speculator wins and is kept (the test above can fail)."""
    fast, spec = _clocked_run(0.0, accuracy_every=1)
    assert fast.stats.governor_wins >= 1 and fast.stats.governor_losses == 0
    assert fast.stats.accepted_tokens > 0


# -- block heads returning garbage (NaN confidences, bad ids, wrong lengths) -------------------

BLOCK_GARBAGE = {  # kind -> (tokens, confidences) given the honest ones
    "NaN confidences": lambda t, c: (t, [float("nan")] * len(c)),
    "inf confidences": lambda t, c: (t, [math.inf] * len(c)),
    "negative confidences": lambda t, c: (t, [-1.0] * len(c)),
    "ids past the vocabulary": lambda t, c: ([VOCAB + 5] * len(t), c),
    "negative ids": lambda t, c: ([-3] * len(t), c),
    "float ids": lambda t, c: ([0.5] * len(t), c),
    "more tokens than asked": lambda t, c: (list(t) * 50, [1.0] * (50 * len(t))),
    "fewer confidences than tokens": lambda t, c: (t, c[:1]),
    "tensors": lambda t, c: (torch.tensor(t), torch.tensor(c)),
    "None": lambda t, c: (None, None),
}


@pytest.mark.parametrize("kind", sorted(BLOCK_GARBAGE) + ["raises"])
def test_block_head_garbage_outputs_are_lossless(kind, tmp_path):
    pytest.importorskip("tsspec_block")
    from tsspec_block.attach import attach_dflash
    from tsspec_block.random_drafter import write_random_dflash
    from tsspec_block.speculator import make_block_speculator

    path = write_random_dflash(tmp_path / "d.gguf", vocab_size=VOCAB, hidden_size=16, target_layers=[1, 2],
                               mask_token_id=VOCAB - 1, num_layers=1, block_size=6, sliding_window=8)
    target = _target()
    head = attach_dflash(target, str(path))
    honest = head.draft_block

    def sabotaged(last_token, h_prev, position, max_tokens):
        if kind == "raises":
            raise RuntimeError("block head exploded")
        tokens, confidences = honest(last_token, h_prev, position, max_tokens)
        return BLOCK_GARBAGE[kind](list(tokens), list(confidences))

    head.draft_block = sabotaged
    options = SpeculationOptions(spec_type="block", pmin=0.35, adaptive=False)
    result = generate(target, PROMPT, options, max_tokens=MAX_TOKENS, speculator=make_block_speculator(target, options))
    assert result.tokens == _plain()
