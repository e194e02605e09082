"""draft-head through the shared runtime on the exact ToyTarget: lossless in every trunk regime
and fold mode, the gate at pmin 0 / 0.75 / 1, fold == no-fold, one head call per step folded,
logit adjustments, and the prefix-reuse rule."""

from __future__ import annotations

import attrs
import pytest

from tsspec.runtime.execution import SpeculativeExecution
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import Sampler, SamplingParams
from tsspec.testing import ToyTarget, assert_lossless
from tsspec_model_toy.heads import PrefixReference, ToyPerTokenHead
from tsspec_draft_head import FOLD_ENV, make_draft_head

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
MAX_TOKENS = 40
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, seed=11)
TRUNKS = {  # ToyTarget settings for the three rollback regimes
    "snapshots": dict(per_row_snapshots=True),  # per-row recurrent snapshot committed
    "reforward": dict(per_row_snapshots=False),  # restore + re-forward the kept prefix
    "kv": dict(recurrent=False),  # pure KV: a rewind
}
HEADS = {
    "oracle": dict(oracle_scale=4.0),  # a good head: drafts what the target says, plus noise
    "confidently-wrong": dict(logit_scale=6.0),  # random weights, sharp: passes the gate, rejected
}


def _target(trunk: str, seed: int = 2) -> ToyTarget:  # seed 2: a varied greedy continuation
    return ToyTarget(seed=seed, **TRUNKS[trunk])


def _attach(target: ToyTarget, trunk: str, head: str, **extra) -> ToyPerTokenHead:
    oracle = _target(trunk) if "oracle_scale" in HEADS[head] else None
    target.draft_head = ToyPerTokenHead.for_target(target, oracle_target=oracle, seed=5, **HEADS[head], **extra)
    return target.draft_head


class Recorder:
    """Wraps a speculator and records each (k_max, proposal) pair; everything else passes on."""

    def __init__(self, inner, strip_adjust: bool = False):
        self.inner, self.strip_adjust, self.proposals, self.commits = inner, strip_adjust, [], 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, ctx):
        if self.strip_adjust:
            ctx = attrs.evolve(ctx, adjust_logits=None)
        drafts = self.inner.propose(ctx)
        self.proposals.append((ctx.max_tokens, list(drafts)))
        return drafts

    def commit(self, tokens, hidden_rows, start_pos):
        self.commits += 1
        return self.inner.commit(tokens, hidden_rows, start_pos)


def _run(trunk="snapshots", head="oracle", *, pmin=None, draft=4, fold=True, sampling=GREEDY,
         monkeypatch, strip_adjust=False, max_tokens=MAX_TOKENS):
    monkeypatch.setenv(FOLD_ENV, "1" if fold else "0")
    target = _target(trunk)
    _attach(target, trunk, head)
    options = SpeculationOptions(adaptive=False, pmin=pmin, draft=draft)
    spec = Recorder(make_draft_head(target, options), strip_adjust)
    gen = generate(target, PROMPT, options, max_tokens=max_tokens, sampling=sampling, speculator=spec)
    return gen, spec


@pytest.mark.parametrize("fold", [True, False], ids=["fold", "no-fold"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("trunk", sorted(TRUNKS))
@pytest.mark.parametrize("head", sorted(HEADS))
def test_lossless(head, trunk, sampling, fold, monkeypatch):
    monkeypatch.setenv(FOLD_ENV, "1" if fold else "0")
    options = SpeculationOptions(adaptive=False, pmin=0.5)

    def make_speculator(target):
        _attach(target, trunk, head)
        return make_draft_head(target, options)

    _, spec = assert_lossless(
        lambda: _target(trunk), make_speculator, PROMPT, max_tokens=MAX_TOKENS, sampling=sampling,
        options=options,
    )
    assert spec.speculator == "draft-head" and spec.stats.faults == 0
    assert spec.stats.draft_tokens > 0  # it really drafted
    if head == "oracle" and sampling is GREEDY:
        assert spec.stats.acceptance_rate > 0.35  # 0.39 to 0.97 by trunk: the toy is unsure at times
    if head == "confidently-wrong":
        assert spec.stats.acceptance_rate < 0.2  # rejections were exercised


def test_lossless_with_a_repeat_penalty(monkeypatch):
    penalised = SamplingParams(temperature=0.7, repeat_penalty=1.8, repeat_last_n=16, seed=3)
    for fold in (True, False):
        monkeypatch.setenv(FOLD_ENV, "1" if fold else "0")

        def make_speculator(target):
            _attach(target, "snapshots", "oracle")
            return make_draft_head(target, SpeculationOptions(adaptive=False))

        _, spec = assert_lossless(
            lambda: _target("snapshots"), make_speculator, PROMPT, max_tokens=MAX_TOKENS, sampling=penalised
        )
        assert spec.stats.draft_tokens > 0


# -- the confidence gate --------------------------------------------------------------------
def test_pmin_zero_always_drafts_to_the_window(monkeypatch):
    gen, spec = _run(pmin=0.0, draft=4, monkeypatch=monkeypatch)
    assert spec.proposals and all(len(d) == min(4, k) for k, d in spec.proposals)
    assert spec.counters.gate_stops == 0 and gen.stats.plain_steps == 0


def test_pmin_one_almost_never_drafts(monkeypatch):
    gen, spec = _run(head="confidently-wrong", pmin=1.0, monkeypatch=monkeypatch)
    assert gen.stats.draft_tokens == 0 and spec.counters.gate_stops == len(spec.proposals)
    gen, spec = _run(head="oracle", pmin=1.0, monkeypatch=monkeypatch)
    assert gen.stats.draft_tokens <= len(spec.proposals) // 10


def test_default_pmin_sits_between_and_filters_bad_drafts(monkeypatch):
    # the KV-only toy is often unsure (top-1 ~0.3 at some positions), so the gate has work to do
    gen0, _ = _run("kv", pmin=0.0, monkeypatch=monkeypatch)
    gen, spec = _run("kv", pmin=None, monkeypatch=monkeypatch)  # the algorithm's default, 0.75
    assert spec.min_draft_prob == 0.75
    assert 0 < spec.counters.gate_stops < len(spec.proposals)
    assert 0 < gen.stats.draft_tokens < gen0.stats.draft_tokens
    assert gen.stats.acceptance_rate > gen0.stats.acceptance_rate
    assert gen.tokens == gen0.tokens


# -- folding --------------------------------------------------------------------------------
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("trunk", sorted(TRUNKS))
def test_fold_and_no_fold_are_identical(trunk, sampling, monkeypatch):
    folded, f_spec = _run(trunk, fold=True, pmin=0.5, sampling=sampling, monkeypatch=monkeypatch)
    unfolded, u_spec = _run(trunk, fold=False, pmin=0.5, sampling=sampling, monkeypatch=monkeypatch)
    assert f_spec.fold_catch_up and not u_spec.fold_catch_up
    assert folded.tokens == unfolded.tokens
    assert f_spec.proposals == u_spec.proposals
    for field in ("steps", "verify_steps", "plain_steps", "drafts", "draft_tokens", "accepted_tokens",
                  "accepted_per_position", "rollback_modes"):
        assert getattr(folded.stats, field) == getattr(unfolded.stats, field), field
    head_f, head_u = f_spec.head, u_spec.head
    # folded: no catch-up calls; every head call is a draft-chain step (the first one fused)
    assert head_f.catch_up_calls == 0
    assert head_f.calls == f_spec.counters.drafted + f_spec.counters.gate_stops
    # unfolded: the same chain steps plus one catch-up per commit
    assert head_u.catch_up_calls == u_spec.commits == f_spec.commits
    assert head_u.calls == head_f.calls + head_u.catch_up_calls


def test_one_head_call_per_step_with_folding(monkeypatch):
    gen, spec = _run(draft=1, pmin=0.0, fold=True, monkeypatch=monkeypatch)
    head = spec.head
    assert len(spec.proposals) == gen.stats.steps - 1  # the last step has no room to draft
    assert head.calls == head.fused_calls == len(spec.proposals)
    gen_u, spec_u = _run(draft=1, pmin=0.0, fold=False, monkeypatch=monkeypatch)
    assert gen_u.tokens == gen.tokens
    assert spec_u.head.calls == len(spec_u.proposals) + spec_u.commits  # a catch-up per commit
    assert spec_u.commits == gen_u.stats.steps + 1  # every step's and the prefill's


# -- logit adjustments ----------------------------------------------------------------------
def test_adjust_logits_keeps_drafts_right_under_a_repeat_penalty(monkeypatch):
    """A huge repeat penalty changes what the target says; a head that ignores it keeps
    proposing the repeats the target will never emit."""
    penalty = SamplingParams(repeat_penalty=50.0, repeat_last_n=64)
    with_adjust, spec_a = _run(pmin=0.0, sampling=penalty, monkeypatch=monkeypatch)
    without, spec_b = _run(pmin=0.0, sampling=penalty, strip_adjust=True, monkeypatch=monkeypatch)
    assert with_adjust.tokens == without.tokens  # lossless either way
    assert spec_a.proposals != spec_b.proposals
    assert with_adjust.stats.acceptance_rate > without.stats.acceptance_rate


# -- prefix reuse ---------------------------------------------------------------------------
@pytest.mark.parametrize("resumes", [False, True])
def test_prefix_reuse_follows_the_head(resumes, monkeypatch):
    target = _target("kv")  # a KV-only trunk rewinds, so a second run reuses the shared prefix
    _attach(target, "kv", "oracle", resumes_after_gap=resumes)
    options = SpeculationOptions(adaptive=False, pmin=0.0)
    spec = make_draft_head(target, options)
    assert spec.can_arm_after_prefix_reuse is resumes
    execution = SpeculativeExecution(target, Sampler(GREEDY), vocab_size=32,
                                     speculator=spec, window=4)
    first = execution.run(PROMPT, 12)
    second_prompt = PROMPT + first[:6] + [7, 7]
    second = execution.run(second_prompt, 16)
    plain = generate(_target("kv"), second_prompt, SpeculationOptions(enabled=False), max_tokens=16)
    assert second == plain.tokens
    if resumes:
        assert execution.stats.draft_tokens > 0  # armed; the head saw a gap and did not crash
        assert 0 not in target.draft_head.cache_positions  # the reused prefix never reached it
    else:
        assert execution.stats.draft_tokens == 0  # not armed after a reused prefix


def test_prefix_reference_matches_plain_logits():
    ref_target, plain_target = _target("snapshots"), _target("snapshots")
    reference = PrefixReference(ref_target)
    seq = PROMPT + [7, 7, 2]
    for n in (3, 5, 11, 4, 11):  # extensions and restarts
        plain_target.spec_rewind_cache(0)
        logits, _ = plain_target.spec_forward(seq[:n], all_logits_rows=False, want_hidden=False)
        plain_target.spec_keep(n)
        assert reference(seq[:n]).equal(logits[-1])
    assert reference.forwarded_tokens == 3 + 2 + 6 + 4 + 7  # restarts only on the shorter prefix


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_losing_head_under_the_governor_is_lossless(sampling, monkeypatch):
    """A confidently wrong head under the cost governor, folded catch-up on: nothing it drafts
    lands (its parking by the calibration's declines is the governor's tests' subject). Output:
    plain decoding's."""
    from tsspec.runtime.governor import SpeculationCostGovernor
    from tsspec.testing import plain_tokens

    monkeypatch.setenv(FOLD_ENV, "1")
    want = plain_tokens(_target("kv"), PROMPT, 120, sampling=sampling)
    target = _target("kv")
    _attach(target, "kv", "confidently-wrong")
    options = SpeculationOptions(pmin=0.0, draft=4)
    spec = Recorder(make_draft_head(target, options))
    # a constant clock: the same steps every run
    governor = SpeculationCostGovernor(initial_backoff=12, max_backoff=48)
    gen = generate(target, PROMPT, options, max_tokens=120, sampling=sampling, speculator=spec,
                   governor=governor, clock=lambda: 0.0)
    assert gen.tokens == want
    assert gen.stats.draft_tokens > 0 and gen.stats.accepted_tokens == 0 and len(spec.proposals) >= 4


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("head", sorted(HEADS))
def test_lossless_under_the_governors_calibrated_gate(head, sampling, monkeypatch):
    """No --spec-pmin and the cost governor on: every proposal carries its confidences for the
    loop's calibration to size (an empty one is the gate's stop). Output: plain decoding's."""
    from tsspec.protocols import Proposal
    from tsspec.testing import plain_tokens

    monkeypatch.setenv(FOLD_ENV, "1")
    want = plain_tokens(_target("kv"), PROMPT, 80, sampling=sampling)
    target = _target("kv")
    _attach(target, "kv", head)
    options = SpeculationOptions(draft=4)
    spec = Recorder(make_draft_head(target, options))
    proposed = []
    inner = spec.inner.propose
    spec.inner.propose = lambda ctx: proposed.append(inner(ctx)) or proposed[-1]
    gen = generate(target, PROMPT, options, max_tokens=80, sampling=sampling, speculator=spec)
    assert gen.tokens == want
    drafted = [p for p in proposed if len(p)]
    assert drafted and all(isinstance(p, Proposal) and len(p.confidence) == len(p) for p in drafted)
    if head == "oracle":
        assert gen.stats.accepted_tokens > 0
