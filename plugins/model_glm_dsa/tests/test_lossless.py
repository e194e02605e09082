"""Lossless generation through the shared loop: speculative output equals plain output token for
token, greedy and seeded, with drafter-free n-gram on a checkpoint without NextN, the NextN head
through ``draft-head``, the testing kit's oracle speculator (controlled partial acceptance) and
random drafts; float32 (the serving path) and float64."""

from __future__ import annotations

import pytest

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import OracleSpeculator, RandomSpeculator, assert_lossless

GREEDY = SamplingParams()
SEEDED = SamplingParams(temperature=0.8, top_k=20, seed=11)
MAX_TOKENS = 24
DTYPES = pytest.mark.parametrize("dtype", ["float32", "float64"])
SAMPLINGS = pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])


@DTYPES
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.3, seed=5)], ids=["greedy", "seeded"])
def test_ngram_serves_without_a_drafter(make_target, sampling, dtype):
    """A checkpoint without NextN (the trunk is drafter-independent); the seeded run is cool
    enough that the random model repeats itself, so n-gram has something to propose."""
    prompt = [5, 6, 7, 8, 9, 10, 11] * 3
    _, spec = assert_lossless(
        lambda: make_target(dtype=dtype), lambda t: None, prompt, max_tokens=MAX_TOKENS, sampling=sampling,
        options=SpeculationOptions(spec_type="ngram", adaptive=False),
    )
    assert spec.speculator == "ngram", spec.decline
    assert spec.stats.draft_tokens > 0


@DTYPES
@SAMPLINGS
def test_nextn_lossless_through_draft_head(make_target, sequence, sampling, dtype):
    _, spec = assert_lossless(
        lambda: make_target(dtype=dtype, with_nextn=True), lambda t: None, sequence[:9], max_tokens=MAX_TOKENS,
        sampling=sampling, options=SpeculationOptions(spec_type="draft-head", pmin=0.0, adaptive=False),
    )
    assert spec.speculator == "draft-head", spec.decline
    assert spec.stats.draft_tokens > 0


@SAMPLINGS
def test_oracle_speculator_at_partial_acceptance(make_target, sequence, sampling):
    prompt = sequence[:11]
    plain = generate(make_target(), prompt, SpeculationOptions(enabled=False), max_tokens=MAX_TOKENS,
                     sampling=sampling)
    reference = prompt + plain.tokens
    _, spec = assert_lossless(
        make_target, lambda t: OracleSpeculator(reference, corrupt=0.4, vocab_size=t.config.vocab_size,
                                                max_draft_tokens=5),
        prompt, max_tokens=MAX_TOKENS, sampling=sampling,
    )
    assert spec.stats.verify_steps > 0
    assert 0 < spec.stats.accepted_tokens < spec.stats.draft_tokens


def test_random_speculator(make_target, sequence):
    _, spec = assert_lossless(
        make_target, lambda t: RandomSpeculator(t.config.vocab_size, max_draft_tokens=4, seed=3),
        sequence[:9], max_tokens=MAX_TOKENS,
    )
    assert spec.stats.draft_tokens > 0
