"""Lossless generation through the shared loop: speculative output equals plain output token for
token, greedy and seeded, with the testing kit's oracle speculator (controlled partial
acceptance, so rollbacks land inside compression windows), random drafts, and drafter-free
n-gram. float64 models: a multi-row verify and one-row decoding agree to ~1e-15."""

from __future__ import annotations

import pytest

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import OracleSpeculator, RandomSpeculator, assert_lossless

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_k=20, seed=11)
MAX_TOKENS = 28


def _maker(make_target, **kw):
    return lambda: make_target(dtype="float64", **kw)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_oracle_speculator_at_partial_acceptance(make_target, sequence, sampling):
    prompt = sequence[:11]
    make = _maker(make_target, with_mtp=False)
    plain = generate(make(), prompt, SpeculationOptions(enabled=False), max_tokens=MAX_TOKENS, sampling=sampling)
    reference = prompt + plain.tokens
    _, spec = assert_lossless(
        make, lambda t: OracleSpeculator(reference, corrupt=0.4, vocab_size=t.config.vocab_size, max_draft_tokens=5),
        prompt, max_tokens=MAX_TOKENS, sampling=sampling,
    )
    assert spec.stats.verify_steps > 0
    assert 0 < spec.stats.accepted_tokens < spec.stats.draft_tokens


def test_random_speculator(make_target, sequence):
    _, spec = assert_lossless(
        _maker(make_target, with_mtp=False), lambda t: RandomSpeculator(t.config.vocab_size, max_draft_tokens=4, seed=3),
        sequence[:9], max_tokens=MAX_TOKENS,
    )
    assert spec.stats.draft_tokens > 0


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.3, seed=5)], ids=["greedy", "sampled"])
def test_ngram_serves_without_a_drafter(make_target, sampling):
    """``--spec-type ngram`` on a checkpoint without any drafter (the trunk is drafter-independent)."""
    prompt = [5, 6, 7, 8, 9, 10, 11] * 4
    _, spec = assert_lossless(
        _maker(make_target, with_mtp=False), lambda t: None, prompt, max_tokens=MAX_TOKENS, sampling=sampling,
        options=SpeculationOptions(spec_type="ngram", adaptive=False),
    )
    assert spec.speculator == "ngram", spec.decline
    assert spec.stats.draft_tokens > 0
