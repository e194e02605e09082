"""The shipped block drafter (tsspec-drafters-smollm2's DFlash head) served to several clients at
once: each request drafts from its own context (the ``block`` algorithm drives a view of the one
head per sequence), so its output equals plain decoding and its drafts equal the same request
served alone, greedy and seeded, through the official client."""

from __future__ import annotations

import threading

import pytest

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams

openai = pytest.importorskip("openai")
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


def _ask(live, i: int, results: dict) -> None:
    client = openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    sampling = _sampling(i)
    reply = client.completions.create(model="smol", prompt=PROMPTS[i], max_tokens=MAX_TOKENS,
                                      temperature=sampling.temperature, seed=sampling.seed)
    timings = reply.model_extra["timings"]
    results[i] = (reply.choices[0].text, timings.get("draft_n", 0), timings.get("draft_n_accepted", 0),
                  reply.model_extra["speculative"]["type"])


def _serve(target, live_server, concurrent: bool) -> dict:
    """Every prompt's (text, drafted, accepted, algorithm) from a fresh server (an empty prefix
    cache), the requests sent one after the other or all at once."""
    import tsspec_block
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec_serve.engine import ServeEngine

    registry = SpeculatorRegistry()  # only what this test needs: block
    tsspec_block.tsspec_register_speculators(registry.register)
    engine = ServeEngine(target, model_id="smol", options=OPTIONS, registry=registry, kv_cache_mb=64, max_seqs=4)
    live, results = live_server(engine), {}
    try:
        if concurrent:
            threads = [threading.Thread(target=_ask, args=(live, i, results)) for i in range(len(PROMPTS))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
        else:
            for i in range(len(PROMPTS)):
                _ask(live, i, results)
    finally:
        live.stop()
    assert len(results) == len(PROMPTS)
    return results


def test_concurrent_requests_on_the_block_drafter_equal_plain_decoding(drafted_target, live_server):
    sequential = _serve(drafted_target, live_server, concurrent=False)
    concurrent = _serve(drafted_target, live_server, concurrent=True)
    plain = SpeculationOptions(enabled=False)
    for i, prompt in enumerate(PROMPTS):
        expected = generate(drafted_target, prompt, plain, max_tokens=MAX_TOKENS, sampling=_sampling(i)).text
        text, drafted, accepted, algorithm = concurrent[i]
        assert algorithm == "block" and drafted > 0
        assert text == sequential[i][0] == expected, f"request {i} differs from plain decoding"
        assert (drafted, accepted) == sequential[i][1:3], f"request {i} drafted differently beside the others"
