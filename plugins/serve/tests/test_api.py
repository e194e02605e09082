"""The OpenAI-compatible API against a live server: the official client, concurrency, a client
that disconnects, every bad request, metrics."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams

openai = pytest.importorskip("openai")

PLAIN = SpeculationOptions(enabled=False)
CHAT = [{"role": "user", "content": "List three colours of the rainbow, then list them again."}]


def _client(live):
    return openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _solo_chat(target, content, max_tokens, sampling=None):
    return generate(target, content, PLAIN, max_tokens=max_tokens, chat=True, sampling=sampling or SamplingParams())


def _solo_text(target, prompt, max_tokens, sampling=None):
    return generate(target, prompt, PLAIN, max_tokens=max_tokens, sampling=sampling or SamplingParams())


def test_models_health_and_page(live):
    client = _client(live)
    assert [m.id for m in client.models.list().data] == ["smol"]
    status, body = live.request("GET", "/health")
    assert status == 200 and body["status"] == "ok"
    status, page = live.request("GET", "/")
    assert status == 200 and "<textarea" in page and "/v1/chat/completions" in page
    assert "http://" not in page and "https://" not in page  # everything served locally, no CDN


def test_chat_plain_and_streaming_equal_solo_decoding(live, embedded_target):
    client = _client(live)
    expected = _solo_chat(embedded_target, CHAT[0]["content"], 12)
    reply = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.prompt_tokens == expected.prompt_tokens and reply.usage.completion_tokens == 12
    assert reply.choices[0].finish_reason == "length"
    extra = reply.model_extra
    assert extra["timings"]["predicted_n"] == 12 and extra["speculative"]["type"] == "ngram"
    pieces, finals = [], []
    stream = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            finals.append(chunk)
    assert "".join(pieces) == expected.text
    assert finals and finals[-1].usage.completion_tokens == 12
    # the second run of the same prompt adopted cached blocks of the first one
    assert finals[0].model_extra["timings"]["cache_n"] > 0


def test_completions_plain_and_streaming_equal_solo_decoding(live, embedded_target):
    client = _client(live)
    prompt = "The three primary colours are"
    sampling = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05, seed=42)
    expected = _solo_text(embedded_target, prompt, 10, sampling)
    kwargs = dict(model="smol", prompt=prompt, max_tokens=10, temperature=0.8, top_p=0.9, seed=42,
                  extra_body={"top_k": 50, "min_p": 0.05})
    reply = client.completions.create(**kwargs)
    assert reply.choices[0].text == expected.text and reply.usage.completion_tokens == len(expected.tokens)
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs) if c.choices)
    assert streamed == expected.text
    # a stop string ends the text before it
    cut = expected.text[3:8]
    stopped = client.completions.create(stop=[cut], **kwargs)
    assert stopped.choices[0].text == expected.text[: expected.text.find(cut)]
    assert stopped.choices[0].finish_reason == "stop"


def test_per_request_speculation_settings_and_timings(live_server, embedded_target):
    # the server's governor off: its verdicts come from measured step times, and a loaded
    # machine can make it decline every draft (then nothing is drafted and draft_n is absent)
    import tsspec_ngram
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec_serve.engine import ServeEngine

    registry = SpeculatorRegistry()
    tsspec_ngram.tsspec_register_speculators(registry.register)
    options = SpeculationOptions(spec_type="ngram", adaptive=False)
    live = live_server(ServeEngine(embedded_target, model_id="smol", options=options, registry=registry,
                                   kv_cache_mb=64, max_seqs=2))
    try:
        _check_per_request_settings(_client(live))
    finally:
        live.stop()


def _check_per_request_settings(client):
    content = "Repeat this sentence twice: the cat sat on the mat and looked at the hat."
    messages = [{"role": "user", "content": content}]
    plain = client.chat.completions.create(model="smol", messages=messages, max_tokens=24, temperature=0,
                                           extra_body={"speculative": {"type": "none"}})
    spec = client.chat.completions.create(model="smol", messages=messages, max_tokens=24, temperature=0,
                                          extra_body={"speculative": {"type": "ngram", "draft": 4, "pmin": 0.0}})
    assert spec.choices[0].message.content == plain.choices[0].message.content  # lossless
    assert plain.model_extra["speculative"]["type"] is None and "draft_n" not in plain.model_extra["timings"]
    timings = spec.model_extra["timings"]
    assert timings["draft_n"] > 0 and 0 <= timings["draft_n_accepted"] <= timings["draft_n"]


def _one(live, embedded_target, i, results):
    client = _client(live)
    prompt = f"Story number {i}: once upon a time in a land of"
    sampling = SamplingParams(temperature=0.7, seed=i) if i % 2 else SamplingParams()
    reply = client.completions.create(
        model="smol", prompt=prompt, max_tokens=8, temperature=sampling.temperature, seed=sampling.seed,
        extra_body={"speculative": {"type": "ngram" if i % 3 else "none"}},
    )
    results[i] = (reply.choices[0].text, prompt, sampling)


@pytest.mark.slow
def test_eight_concurrent_clients_each_equal_their_solo_run(live, embedded_target):
    results: dict = {}
    threads = [threading.Thread(target=_one, args=(live, embedded_target, i, results)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(results) == 8
    before = live.engine.scheduler.steps
    for i, (text, prompt, sampling) in sorted(results.items()):
        assert text == _solo_text(embedded_target, prompt, 8, sampling).text, f"client {i} differs from its solo run"
    assert live.engine.scheduler.steps == before  # the solo runs above did not use the server


def test_disconnect_mid_stream_frees_the_sequence(live):
    scheduler = live.engine.scheduler
    cancelled = scheduler.snapshot()["finished"]["cancelled"]
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    body = {"model": "smol", "prompt": "Count from one to one hundred: one, two,", "max_tokens": 400, "stream": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    got = b""
    while got.count(b"data: ") < 3:
        got += response.read1(4096)
    conn.sock.shutdown(2)  # the client goes away mid-stream
    conn.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        snap = scheduler.snapshot()
        if snap["finished"]["cancelled"] > cancelled and snap["running"] == 0:
            break
        time.sleep(0.1)
    snap = scheduler.snapshot()
    assert snap["finished"]["cancelled"] == cancelled + 1
    assert snap["running"] == 0 and snap["kv_blocks_in_use"] == 0 and snap["kv_blocks_reserved"] == 0
    status, _ = live.request("POST", "/v1/completions", {"model": "smol", "prompt": "Hello", "max_tokens": 2})
    assert status == 200  # still serving


BAD = [
    # (path, body or raw bytes, param named in the error)
    ("/v1/chat/completions", b"{not json", None),
    ("/v1/chat/completions", {"model": "gpt-9", "messages": CHAT}, "model"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "max_tokens": 100000}, "max_tokens"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "temperature": 3}, "temperature"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "top_p": 1.5}, "top_p"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "top_k": -1}, "top_k"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "min_p": 2}, "min_p"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "seed": 1.5}, "seed"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "n": 2}, "n"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "stop": [1]}, "stop"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"model": "smol", "messages": []}, "messages"),
    ("/v1/chat/completions", {"model": "smol", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "speculative": {"type": "magic"}}, "speculative.type"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "speculative": {"draft": 0}}, "speculative.draft"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "speculative": {"pmin": 2}}, "speculative.pmin"),
    ("/v1/chat/completions", {"model": "smol", "messages": [{"role": "user", "content": "word " * 9000}]}, "messages"),
    ("/v1/completions", {"model": "smol", "prompt": "word " * 9000}, "prompt"),
    ("/v1/completions", {"model": "smol", "prompt": 5}, "prompt"),
    ("/v1/completions", {"model": "smol", "prompt": [-1, 3]}, "prompt"),
    ("/v1/completions", [1, 2], None),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "logit_bias": {"x": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "logit_bias": {"99999999": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "presence_penalty": 2.5}, "presence_penalty"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "frequency_penalty": "x"}, "frequency_penalty"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "logprobs": 3}, "logprobs"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"model": "smol", "prompt": "Hi", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"model": "smol", "prompt": "Hi", "suffix": "end"}, "suffix"),
    ("/v1/completions", {"model": "smol", "prompt": "Hi", "echo": True}, "echo"),
    ("/v1/completions", {"model": "smol", "prompt": "Hi", "best_of": 2}, "best_of"),
]


@pytest.mark.parametrize("path,body,param", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_requests_get_a_400_naming_the_field(live, path, body, param):
    raw = body if isinstance(body, bytes) else None
    status, reply = live.request("POST", path, None if raw else body, raw=raw)
    assert status == 400, reply
    error = reply["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    if param:
        assert param.split("[")[0].split(".")[-1] in error["message"] or param.split(".")[0] in error["message"]


def test_unknown_path_and_method_are_openai_errors(live):
    status, reply = live.request("GET", "/v1/nothing")
    assert status == 404 and "error" in reply
    status, reply = live.request("GET", "/v1/completions")
    assert status == 405 and "error" in reply


def test_metrics_exposes_the_spec_decode_names(live):
    client = _client(live)
    client.completions.create(model="smol", prompt="a b c a b c a b c a b", max_tokens=6, temperature=0)
    status, text = live.request("GET", "/metrics")
    assert status == 200
    for name in (
        "tsspec:spec_decode_num_drafts_total", "tsspec:spec_decode_num_draft_tokens_total",
        "tsspec:spec_decode_num_accepted_tokens_total", 'tsspec:spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
        'tsspec:request_success_total{finished_reason="length"}', "tsspec:time_to_first_token_seconds_bucket",
        "tsspec:inter_token_latency_seconds_bucket", "tsspec:num_requests_running", "tsspec:num_requests_waiting",
        "tsspec:prefix_cache_hit_rate", "tsspec:prefix_cache_hits_total", "tsspec:governor_parked_steps_total",
        "tsspec:kv_cache_usage_perc", "tsspec:request_errors_total",
        "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
    ):
        assert name in text, name
    drafts = [line for line in text.splitlines() if line.startswith("tsspec:spec_decode_num_draft_tokens_total")]
    assert float(drafts[0].split()[-1]) > 0
