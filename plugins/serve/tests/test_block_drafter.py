"""The shipped block drafter (tsspec-drafters-smollm2's DFlash head) served to several clients at
once: each request drafts from its own context (the ``block`` algorithm drives a view of the one
head per sequence), so its output equals plain decoding and its drafts equal the same request
served alone, greedy and seeded, through the official client."""

from __future__ import annotations

import pytest

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams

pytest.importorskip("openai")
drafters = pytest.importorskip("tsspec_drafters_smollm2")
pytest.importorskip("tsspec_block")

DFLASH_FILE = drafters.HERE / "smollm2-135m-instruct-dflash.gguf"
# the governor off (its parks follow measured step times, which concurrency changes) and no
# confidence floor: every request drafts every step, so the views are exercised throughout
OPTIONS = SpeculationOptions(spec_type="block", adaptive=False, pmin=0.0)
PROMPTS = (  # no common prefix of a whole KV block (16 tokens): no request adopts another's blocks
    "The capital of France is Paris. The capital of Spain is",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "Monday, Tuesday, Wednesday,",
    "One, two, three, four, five,",
)
MAX_TOKENS = 16


def _sampling(i: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, seed=200 + i) if i % 2 else SamplingParams()


@pytest.fixture(scope="module")
def drafted_target(embedded_target):
    """The embedded model with the shipped DFlash drafter attached (its feature taps set), put
    back as it was afterwards."""
    from tsspec_block.attach import attach_dflash

    if not DFLASH_FILE.is_file():
        pytest.skip("the shipped DFlash drafter is not in this install")
    previous, taps = embedded_target.draft_head, embedded_target.feature_taps
    attach_dflash(embedded_target, DFLASH_FILE)
    yield embedded_target
    embedded_target.draft_head = previous
    embedded_target.spec_set_feature_taps(taps)


def test_concurrent_requests_on_the_block_drafter_equal_plain_decoding(drafted_target, serve_completions, engine_for):
    import tsspec_block

    samplings = [_sampling(i) for i in range(len(PROMPTS))]
    runs = {concurrent: serve_completions(engine_for(drafted_target, tsspec_block, OPTIONS), PROMPTS, samplings,
                                          MAX_TOKENS, concurrent=concurrent) for concurrent in (False, True)}
    sequential, concurrent = runs[False], runs[True]
    plain = SpeculationOptions(enabled=False)
    for i, prompt in enumerate(PROMPTS):
        expected = generate(drafted_target, prompt, plain, max_tokens=MAX_TOKENS, sampling=_sampling(i)).text
        text, drafted, accepted, algorithm = concurrent[i]
        assert algorithm == "block" and drafted > 0
        assert text == sequential[i][0] == expected, f"request {i} differs from plain decoding"
        assert (drafted, accepted) == sequential[i][1:3], f"request {i} drafted differently beside the others"
