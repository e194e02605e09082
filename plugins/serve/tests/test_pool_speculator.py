"""``ngram-pool``: lossless whatever the pool holds (greedy and seeded, on the exact toy), drafts
from a request's own tokens and from the pool, and its registration."""

from __future__ import annotations

import random

import pytest

from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import ToyTarget, assert_lossless, plain_tokens, plugin_catalog
from tsspec_serve.memory import DraftPool
from tsspec_serve.pool_speculator import NAME, PoolSpeculator, make_pool_speculator

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_k=8, seed=11)
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


def _pool_of(*texts):
    pool = DraftPool()
    for text in texts:
        pool.merge(text)
    return pool


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("recurrent", [False, True])
def test_lossless_from_a_pool_of_earlier_answers(sampling, recurrent):
    make = lambda: ToyTarget(vocab_size=16, seed=3, recurrent=recurrent)  # noqa: E731
    earlier = PROMPT + plain_tokens(make(), PROMPT, 40, sampling)  # what the same request gave before
    report = {}
    plain, spec = assert_lossless(make, lambda t: PoolSpeculator(_pool_of(earlier, earlier), report=report),
                                  PROMPT, max_tokens=40, sampling=sampling)
    assert report["pool_drafts"] > 0 and report["pool_matched"] > 0
    assert spec.stats.accepted_tokens > 0 and spec.stats.faults == 0


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_lossless_from_a_pool_of_noise(sampling):
    rng = random.Random(5)
    noise = [[rng.randrange(16) for _ in range(60)] for _ in range(6)]
    report = {}
    plain, spec = assert_lossless(lambda: ToyTarget(vocab_size=16, seed=4),
                                  lambda t: PoolSpeculator(_pool_of(*noise, *noise), min_share=0.3, report=report),
                                  PROMPT * 2, max_tokens=40, sampling=sampling)
    assert report["pool_drafts"] + report["own_drafts"] > 0
    assert spec.stats.draft_tokens > spec.stats.accepted_tokens  # wrong drafts were verified away


def test_without_a_pool_it_drafts_from_the_request_alone():
    report = {}
    plain, spec = assert_lossless(lambda: ToyTarget(vocab_size=16, seed=1, recurrent=False),
                                  lambda t: PoolSpeculator(None, report=report), [1, 2, 3, 4, 5, 6, 7] * 4,
                                  max_tokens=32)
    assert report["own_drafts"] > 0 and report["pool_drafts"] == 0


def test_a_pool_draft_chains_followers_with_their_confidence():
    from tsspec.protocols import DraftContext

    text = list(range(20, 40))
    spec = PoolSpeculator(_pool_of(text))
    history = [1, 2] + text[:8]
    draft = spec.propose(DraftContext(last_token=history[-1], position=len(history) - 1, max_tokens=5,
                                      history=history))
    assert list(draft) == text[8:13] and draft.confidence == [0.5] * 5  # seen once
    own = PoolSpeculator(_pool_of(text))
    history = [7, 8, 9, 10, 11, 3, 7, 8, 9, 10, 11]  # its own earlier 7..11 was followed by 3
    draft = own.propose(DraftContext(last_token=11, position=10, max_tokens=4, history=history))
    assert draft == [3, 7, 8, 9] and not hasattr(draft, "confidence")  # verified whole, as ngram's


def test_the_factory_reads_its_settings_and_names_unknown_ones():
    pool, report = DraftPool(), {}
    made = make_pool_speculator(None, SpeculationOptions(spec_type=NAME, extra={NAME: {"pool": pool, "report": report}}))
    assert made.pool is pool and made.report is report
    with pytest.raises(ValueError, match="unknown ngram-pool settings"):
        make_pool_speculator(None, SpeculationOptions(extra={NAME: {"size": 3}}))
    with pytest.raises(ValueError, match="DraftPool"):
        make_pool_speculator(None, SpeculationOptions(extra={NAME: {"pool": {}}}))


def test_registered_as_a_weight_free_algorithm_behind_ngram():
    import tsspec_serve

    catalog = plugin_catalog({"serve": tsspec_serve})
    entry = catalog.speculators.get(NAME)
    assert entry is not None and entry.weight_free and not entry.requires_draft_head
    assert entry.auto_priority < 100  # `auto` keeps ngram outside the server's memory
    rows = {r["name"]: r for r in catalog.speculators.evaluate(ToyTarget(seed=1), SpeculationOptions())}
    assert rows[NAME]["status"] == "serves"
