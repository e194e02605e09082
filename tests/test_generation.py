"""generate(): presence/frequency penalties and a logit bias stay lossless under speculation (the
verify rows adjust their logits exactly as the plain steps do), and logprobs agree whether a
token came from a verify row or a plain step."""

from __future__ import annotations

import pytest

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import OracleSpeculator, RandomSpeculator, ToyTarget, assert_lossless

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
PENALISED = {
    "greedy": SamplingParams(presence_penalty=0.7, frequency_penalty=0.4, repeat_last_n=16,
                             logit_bias=((4, 1.5), (9, -3.0))),
    "seeded": SamplingParams(temperature=0.9, top_k=20, presence_penalty=-0.5, frequency_penalty=1.2,
                             repeat_penalty=1.1, seed=11),
}


def _target() -> ToyTarget:
    return ToyTarget(seed=2)


@pytest.mark.parametrize("sampling", list(PENALISED), ids=list(PENALISED))
@pytest.mark.parametrize("drafter", ["oracle", "random"])
def test_penalties_and_bias_are_lossless_under_speculation(sampling, drafter):
    params = PENALISED[sampling]
    if drafter == "oracle":  # mostly accepted drafts, some corrupted
        make = lambda t: OracleSpeculator.from_plain_run(_target(), PROMPT, 40, sampling=params, corrupt=0.3, seed=1)
    else:  # mostly rejected drafts
        make = lambda t: RandomSpeculator(t.config.vocab_size, seed=3)
    plain, spec = assert_lossless(_target, make, PROMPT, max_tokens=40, sampling=params)
    assert spec.stats.draft_tokens > 0 and spec.stats.accepted_tokens > 0 or drafter == "random"
    # the penalties really changed the output
    unpenalised = generate(_target(), PROMPT, SpeculationOptions(enabled=False), max_tokens=40,
                           sampling=SamplingParams(temperature=params.temperature, top_k=params.top_k, seed=params.seed))
    assert unpenalised.tokens != plain.tokens


def test_logprobs_equal_between_verify_rows_and_plain_steps():
    params = PENALISED["seeded"]
    sink: list = []
    plain = generate(_target(), PROMPT, SpeculationOptions(enabled=False), max_tokens=30, sampling=params,
                     logprobs=3, logprob_sink=sink)
    speculator = OracleSpeculator.from_plain_run(_target(), PROMPT, 30, sampling=params, corrupt=0.2, seed=4)
    spec = generate(_target(), PROMPT, SpeculationOptions(adaptive=False), max_tokens=30, sampling=params,
                    speculator=speculator, logprobs=3)
    assert spec.stats.accepted_tokens > 0
    assert spec.tokens == plain.tokens
    assert plain.logprobs is sink and len(sink) == len(plain.tokens)
    assert [e.token for e in plain.logprobs] == plain.tokens
    # the same token and top ids; the values agree to rounding (a toy verify row's logits may
    # differ from the plain step's in the last bits)
    for a, b in zip(plain.logprobs, spec.logprobs):
        assert a.token == b.token and [i for i, _ in a.top] == [i for i, _ in b.top]
        assert b.logprob == pytest.approx(a.logprob, rel=1e-9, abs=1e-12)
    assert all(len(e.top) == 3 and e.logprob <= 0.0 for e in plain.logprobs)
    assert generate(_target(), PROMPT, SpeculationOptions(enabled=False), max_tokens=5).logprobs is None
