"""A live server on 127.0.0.1 (the embedded model, the real scheduler) shared by a test module."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    previous = os.environ.get("TSSPEC_CACHE_DIR")
    os.environ["TSSPEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("weight-cache"))
    yield
    if previous is None:
        os.environ.pop("TSSPEC_CACHE_DIR", None)
    else:
        os.environ["TSSPEC_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def embedded_target():
    from tsspec_gguf import native
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec_model_llama import load_llama

    if not native.available():
        pytest.skip("the CPU block kernels were not built: the batched path needs them")
    return load_llama(embedded_model_path())


class LiveServer:
    """uvicorn serving ``create_app(engine)`` in a thread on a loopback port."""

    def __init__(self, engine, app=None):
        import uvicorn

        from tsspec_serve.api import create_app

        self.engine = engine.start()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app or create_app(engine), log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body=None, *, raw: bytes | None = None, timeout: float = 120):
        """(status, parsed JSON or text) over a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        text = response.read().decode()
        conn.close()
        try:
            return response.status, json.loads(text)
        except json.JSONDecodeError:
            return response.status, text

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.engine.close()
        self.sock.close()


@pytest.fixture(scope="session")
def live_server():
    """The ``LiveServer`` class, for a test that starts servers of its own."""
    return LiveServer


@pytest.fixture(scope="module")
def live(embedded_target):
    import tsspec_ngram
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec_serve.engine import ServeEngine

    registry = SpeculatorRegistry()  # only what these tests need: ngram
    tsspec_ngram.tsspec_register_speculators(registry.register)
    engine = ServeEngine(embedded_target, model_id="smol", options=SpeculationOptions(spec_type="ngram"),
                         registry=registry, kv_cache_mb=64, max_seqs=8)
    server = LiveServer(engine)
    yield server
    server.stop()


def _complete(live: LiveServer, prompt: str, max_tokens: int, sampling) -> tuple:
    """One completion through the official client: (text, drafted, accepted, algorithm)."""
    import openai

    client = openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.completions.create(model="smol", prompt=prompt, max_tokens=max_tokens,
                                      temperature=sampling.temperature, seed=sampling.seed)
    timings = reply.model_extra["timings"]
    return (reply.choices[0].text, timings.get("draft_n", 0), timings.get("draft_n_accepted", 0),
            reply.model_extra["speculative"]["type"])


# prompts with no common prefix of a whole KV block (16 tokens): no request adopts another's blocks
VIEW_PROMPTS = (
    "The capital of France is Paris. The capital of Spain is",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "Monday, Tuesday, Wednesday,",
    "One, two, three, four, five,",
)
VIEW_MAX_TOKENS = 16


def _serve(engine, prompts, samplings, max_tokens: int, concurrent: bool) -> dict:
    """Every prompt's (text, drafted, accepted, algorithm) from a fresh server on ``engine``, the
    requests sent one after the other or all at once (one client thread each)."""
    live, results = LiveServer(engine), {}

    def ask(i: int) -> None:
        results[i] = _complete(live, prompts[i], max_tokens, samplings[i])

    try:
        if concurrent:
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
        else:
            for i in range(len(prompts)):
                ask(i)
    finally:
        live.stop()
    assert len(results) == len(prompts)
    return results


@pytest.fixture(scope="session")
def served_alone_and_together(engine_for):
    """``check(target, plugin, options, algorithm, seed)``: serves ``VIEW_PROMPTS`` (odd ones
    seeded-sampled from ``seed + i``, even ones greedy) one after the other and all at once, and
    asserts every request ran ``algorithm``, drafted, equals plain decoding, and drafted and
    accepted exactly as it did alone; returns the concurrent runs' (text, drafted, accepted,
    algorithm) by request."""
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.sampling import SamplingParams

    def check(target, plugin, options, algorithm: str, seed: int) -> dict:
        samplings = [SamplingParams(temperature=0.8, seed=seed + i) if i % 2 else SamplingParams()
                     for i in range(len(VIEW_PROMPTS))]
        sequential, concurrent = (_serve(engine_for(target, plugin, options), VIEW_PROMPTS, samplings,
                                         VIEW_MAX_TOKENS, concurrent=c) for c in (False, True))
        plain = SpeculationOptions(enabled=False)
        for i, prompt in enumerate(VIEW_PROMPTS):
            expected = generate(target, prompt, plain, max_tokens=VIEW_MAX_TOKENS, sampling=samplings[i]).text
            text, drafted, accepted, ran = concurrent[i]
            assert ran == algorithm and drafted > 0
            assert text == sequential[i][0] == expected, f"request {i} differs from plain decoding"
            assert (drafted, accepted) == sequential[i][1:3], f"request {i} drafted differently beside the others"
        return concurrent

    return check


@pytest.fixture(scope="session")
def engine_for():
    """``engine_for(target, plugin, options)``: a ``ServeEngine`` on ``target`` whose registry
    holds only the speculators ``plugin`` (a module with the speculators hook) registers."""

    def make(target, plugin, options, *, max_seqs: int = 4):
        from tsspec.runtime.registry import SpeculatorRegistry
        from tsspec_serve.engine import ServeEngine

        registry = SpeculatorRegistry()
        plugin.tsspec_register_speculators(registry.register)
        return ServeEngine(target, model_id="smol", options=options, registry=registry, kv_cache_mb=64,
                           max_seqs=max_seqs)

    return make
