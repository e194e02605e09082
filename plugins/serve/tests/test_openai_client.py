"""What an operator expects, through the official ``openai`` client: an omitted model, an
over-long prompt, streaming usage and timings, logprobs, penalties and a logit bias (each equal
to the same request decoded alone, under speculation), API keys and the advertised context."""

from __future__ import annotations

import threading

import pytest

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams

openai = pytest.importorskip("openai")

PLAIN = SpeculationOptions(enabled=False)
REPEATING = "Repeat after me: red green blue, red green blue, red green blue,"


def _client(live, key: str = "unused"):
    return openai.OpenAI(base_url=live.base_url + "/v1", api_key=key, max_retries=0, timeout=120)


def test_an_omitted_model_uses_the_loaded_one(live):
    status, reply = live.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 3, "temperature": 0})
    assert status == 200 and reply["model"] == "smol" and reply["usage"]["completion_tokens"] == 3
    status, reply = live.request("POST", "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert status == 200 and reply["model"] == "smol"
    # the client's own way to leave it out
    reply = _client(live).completions.create(model=openai.NOT_GIVEN, prompt="Hello", max_tokens=2)
    assert reply.model == "smol"


def test_an_over_long_prompt_is_a_400_naming_the_real_limit(live):
    context = live.engine.context
    assert context < live.engine.target.max_context_length  # the fixture's 64 MiB cache holds less
    models = _client(live).models.list().data
    assert models[0].model_extra["max_model_len"] == context
    with pytest.raises(openai.BadRequestError) as caught:
        _client(live).completions.create(model="smol", prompt=[1] * (context + 5), max_tokens=1)
    error = caught.value.body
    assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"
    assert str(context) in error["message"] and "--kv-cache-mb" in error["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        _client(live).completions.create(model="smol", prompt="Hello", max_tokens=context)
    assert caught.value.body["param"] == "max_tokens" and "KV cache" in caught.value.body["message"]
    # what it advertises it holds: a request of exactly that size runs
    reply = _client(live).completions.create(model="smol", prompt=[1] * (context - 2), max_tokens=2, temperature=0)
    assert reply.usage.total_tokens <= context


def test_streaming_carries_timings_and_a_usage_chunk(live, embedded_target):
    client = _client(live)
    chunks = list(client.completions.create(model="smol", prompt=REPEATING, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    timings = final.model_extra["timings"]
    for name in ("prompt_n", "prompt_per_second", "predicted_n", "predicted_per_second", "draft_n", "draft_n_accepted"):
        assert name in timings, name
    assert timings["predicted_n"] == 20 and timings["draft_n"] >= timings["draft_n_accepted"] > 0
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 20
    assert usage_chunk.usage.prompt_tokens == len(embedded_target.tokenizer.encode(REPEATING))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == generate(embedded_target, REPEATING, PLAIN, max_tokens=20).text


def test_concurrent_clients_get_identical_outputs(live, embedded_target):
    prompts = [f"Item {i}: the colours of the rainbow are red, orange," for i in range(6)]
    results: dict = {}

    def ask(i):
        reply = _client(live).completions.create(model="smol", prompt=prompts[i], max_tokens=10, temperature=0)
        results[i] = reply.choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(results) == len(prompts)
    for i, prompt in enumerate(prompts):
        assert results[i] == generate(embedded_target, prompt, PLAIN, max_tokens=10).text, i


def test_penalties_and_a_logit_bias_equal_the_solo_run_under_speculation(live, embedded_target):
    bias = {str(embedded_target.tokenizer.encode(" blue", add_special_tokens=False)[0]): -100}
    for temperature, seed in ((0.0, 0), (0.8, 5)):
        reply = _client(live).completions.create(
            model="smol", prompt=REPEATING, max_tokens=24, temperature=temperature, seed=seed,
            presence_penalty=0.6, frequency_penalty=0.3, logit_bias=bias,
            extra_body={"speculative": {"type": "ngram", "pmin": 0.0}},
        )
        sampling = SamplingParams(temperature=temperature, seed=seed, presence_penalty=0.6, frequency_penalty=0.3,
                                  logit_bias=tuple((int(k), float(v)) for k, v in bias.items()))
        solo = generate(embedded_target, REPEATING, PLAIN, max_tokens=24, sampling=sampling)
        assert reply.choices[0].text == solo.text
        assert " blue" not in reply.choices[0].text
        assert reply.choices[0].text != generate(embedded_target, REPEATING, PLAIN, max_tokens=24,
                                                 sampling=SamplingParams(temperature=temperature, seed=seed)).text
        assert reply.model_extra["speculative"]["type"] == "ngram"


def test_logprobs_whole_and_streamed_equal_the_solo_run(live, embedded_target):
    client = _client(live)
    messages = [{"role": "user", "content": "Count: one, two, three, four,"}]
    solo = generate(embedded_target, messages[0]["content"], PLAIN, max_tokens=12, chat=True, logprobs=2)
    reply = client.chat.completions.create(model="smol", messages=messages, max_tokens=12, temperature=0,
                                           logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([e.logprob for e in solo.logprobs], rel=1e-5, abs=1e-6)
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.logprob for c in content)
    assert "".join(c.token for c in content) == reply.choices[0].message.content
    streamed = [c for c in client.chat.completions.create(model="smol", messages=messages, max_tokens=12, temperature=0,
                                                          logprobs=True, top_logprobs=2, stream=True)]
    parts = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(p.token, p.logprob) for p in parts] == [(c.token, c.logprob) for c in content]
    plain = client.completions.create(model="smol", prompt="One, two, three,", max_tokens=6, temperature=0, logprobs=3)
    lp = plain.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6 and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == plain.choices[0].text
    assert client.completions.create(model="smol", prompt="Hi", max_tokens=2).choices[0].logprobs is None


def test_api_keys_guard_the_v1_routes(embedded_target, live_server):
    import tsspec_ngram
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec_serve.api import create_app
    from tsspec_serve.engine import ServeEngine

    registry = SpeculatorRegistry()
    tsspec_ngram.tsspec_register_speculators(registry.register)
    engine = ServeEngine(embedded_target, model_id="smol", registry=registry, kv_cache_mb=32, max_seqs=2)
    server = live_server(engine, app=create_app(engine, api_keys=["key-a", "key-b"]))
    try:
        with pytest.raises(openai.AuthenticationError) as caught:
            _client(server, "wrong").models.list()
        assert caught.value.status_code == 401 and caught.value.body["code"] == "invalid_api_key"
        status, body = server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
        assert status == 401 and "Bearer" in body["error"]["message"]
        for key in ("key-a", "key-b"):
            assert _client(server, key).completions.create(model="smol", prompt="Hi", max_tokens=1).usage.completion_tokens == 1
        assert server.request("GET", "/health")[0] == 200 and server.request("GET", "/metrics")[0] == 200
    finally:
        server.stop()


def test_the_default_cache_holds_the_models_whole_context(embedded_target):
    from tsspec_serve.engine import ServeEngine

    engine = ServeEngine(embedded_target, model_id="smol", max_seqs=1)
    try:
        assert engine.context == embedded_target.max_context_length
        assert engine.context_label == "the model's context"
        request_blocks = engine.scheduler.blocks_needed(engine.context - 100, 100)
        assert request_blocks <= engine.scheduler.pool.num_blocks
    finally:
        engine.close()
