"""End to end on the exact toy target: speculative output == plain output, and drafts land."""

from __future__ import annotations

import pytest

from tsspec.runtime.execution import SpeculativeExecution
from tsspec.runtime.governor import SpeculationCostGovernor
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import Sampler, SamplingParams
from tsspec.testing import ToyTarget, assert_lossless
from tsspec_ngram import NGramSpeculator, make_ngram

REPEATING = [1, 2, 3, 4, 5, 6, 7, 8, 9] * 4
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_k=8, seed=11)


@pytest.mark.parametrize("per_row_snapshots", [False, True])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("seed", [1, 4])
def test_lossless_with_accepted_drafts(per_row_snapshots, sampling, seed):
    plain, spec = assert_lossless(
        lambda: ToyTarget(vocab_size=16, seed=seed, per_row_snapshots=per_row_snapshots),
        lambda target: make_ngram(target, SpeculationOptions(spec_type="ngram", draft=6)),
        REPEATING,
        max_tokens=48,
        sampling=sampling,
    )
    stats = spec.stats
    assert stats.faults == 0
    assert stats.drafts > 0 and stats.accepted_tokens > 0


def test_lossless_with_rejections_on_a_pure_kv_trunk():
    plain, spec = assert_lossless(
        lambda: ToyTarget(vocab_size=16, seed=1, recurrent=False),
        lambda target: NGramSpeculator(8),
        REPEATING,
        max_tokens=48,
    )
    assert spec.stats.accepted_tokens > 0
    assert spec.stats.accepted_tokens < spec.stats.draft_tokens  # some drafts were wrong


@pytest.mark.parametrize("pmin", [0.0, 0.5, 1.0])
def test_lossless_at_every_pmin(pmin):
    assert_lossless(
        lambda: ToyTarget(vocab_size=16, seed=4),
        lambda target: make_ngram(target, SpeculationOptions(pmin=pmin)),
        REPEATING,
        max_tokens=32,
        sampling=SAMPLED,
    )


def _run_twice(speculator, prompts, max_tokens=24):
    """Two runs on one execution: the second reuses the KV prefix it shares with the first."""
    target = ToyTarget(vocab_size=16, seed=4, recurrent=False)
    execution = SpeculativeExecution(
        target,
        Sampler(GREEDY),
        vocab_size=16,
        speculator=speculator,
        window=6,
        governor=SpeculationCostGovernor(enabled=False),
    )
    outs = [execution.run(p, max_tokens) for p in prompts]
    return outs, execution.stats


def test_lossless_after_prefix_reuse():
    prompts = [REPEATING, REPEATING[:20] + [9, 9, 3, 4, 5, 6]]
    plain, _ = _run_twice(None, prompts)
    spec, stats = _run_twice(NGramSpeculator(6), prompts)
    assert spec == plain
    assert stats.drafts > 0  # armed after the reused prefix (can_arm_after_prefix_reuse)


class CopyEditTarget(ToyTarget):
    """A pure-KV toy whose logits add a large bonus on a scripted answer at each position: the
    answer copies spans of the prompt and jumps between them on a token seen once before, which
    is where the single-token fallback drafts. Its own (KV-dependent) logits stay underneath."""

    BONUS = 40.0  # the toy's own logits span about +-17

    def __init__(self, script: list[int], seed: int):
        super().__init__(vocab_size=64, seed=seed, recurrent=False)
        self.script = script

    def spec_forward(self, tokens, *, all_logits_rows: bool, want_hidden: bool):
        start = self.cache_seq_len
        logits, hidden = super().spec_forward(tokens, all_logits_rows=all_logits_rows, want_hidden=want_hidden)
        logits = logits.clone()  # [rows, vocab]
        first = start + len(tokens) - logits.shape[0]
        for row in range(logits.shape[0]):
            pos = first + row + 1
            if pos < len(self.script):
                logits[row, self.script[pos]] += self.BONUS
        return logits, hidden


SOURCE = list(range(10, 30))
ELSEWHERE = list(range(40, 60))
COPY_PROMPT = [1, *SOURCE, 2, *ELSEWHERE, 3]
# copies 10..15, jumps to 45.. (15 -> 45 never occurred; 45 alone did, once), back to 20.., ...
COPY_ANSWER = [*SOURCE[:6], *ELSEWHERE[5:12], *SOURCE[10:16], *ELSEWHERE[14:19], *SOURCE[2:8]]


class KeyRecorder(NGramSpeculator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keys = []

    def propose(self, ctx):
        from tsspec_ngram.matching import match_length

        draft = super().propose(ctx)
        tokens = self._drafter.index.tokens
        self.keys.append(match_length(tokens, self._drafter._match.pos, len(tokens), 8) if draft else None)
        return draft


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("seed", [1, 2])
def test_lossless_with_single_token_fallback_drafts(sampling, seed):
    made = []

    def make(target):
        made.append(KeyRecorder(8))
        return made[-1]

    plain, spec = assert_lossless(
        lambda: CopyEditTarget(COPY_PROMPT + COPY_ANSWER, seed),
        make,
        COPY_PROMPT,
        max_tokens=len(COPY_ANSWER),
        sampling=sampling,
    )
    assert spec.stats.faults == 0
    if sampling is GREEDY:
        assert plain.tokens == COPY_ANSWER  # the bonus decides every greedy token
        assert 1 in made[0].keys  # the fallback (a one-token match) drafted
        assert spec.stats.accepted_tokens > 0
