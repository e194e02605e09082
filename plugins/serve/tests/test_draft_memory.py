"""The cross-request draft memory through the ``openai`` client: a pool that survives a restart,
a damaged pool file that is ignored with a warning, and one pool per API key (a second key gets
no drafts from the first key's history). Output always equals plain decoding."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

PROMPT = ("Tool schema: search(query: str, limit: int) returns a list of titles. "
          "Call it as JSON. User: find three papers about speculative decoding on CPUs.")


def _engine(target, store):
    import tsspec_ngram
    import tsspec_serve
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec_serve.engine import ServeEngine

    registry = SpeculatorRegistry()
    tsspec_ngram.tsspec_register_speculators(registry.register)
    tsspec_serve.tsspec_register_speculators(registry.register)
    return ServeEngine(target, model_id="smol", options=SpeculationOptions(spec_type="auto"), registry=registry,
                       kv_cache_mb=64, max_seqs=4, memory=store)


def _store(path):
    from tsspec_serve.memory import PoolStore

    store = PoolStore("smol:test", path)
    store.load()
    return store


def _ask(server, key: str = "unused", **speculative):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0, timeout=300)
    reply = client.completions.create(model="smol", prompt=PROMPT, max_tokens=24, temperature=0,
                                      extra_body={"speculative": speculative} if speculative else None)
    return reply.choices[0].text, reply.model_extra["speculative"]


def test_the_pool_survives_a_restart(embedded_target, live_server, tmp_path):
    path = tmp_path / "pool.bin"
    server = live_server(_engine(embedded_target, _store(path)))
    try:
        first, spec = _ask(server)
        assert spec["type"] == "ngram-pool" and spec["memory"]["pool_drafts"] == 0  # `auto`; nothing yet
    finally:
        server.stop()  # the engine saves its pools
    assert path.stat().st_size > 0
    store = _store(path)
    assert store.warning is None and len(store.pool("")) > 0
    server = live_server(_engine(embedded_target, store))
    try:
        again, spec = _ask(server)
    finally:
        server.stop()
    assert again == first  # lossless
    assert spec["memory"]["pool_drafts"] > 0 and spec["memory"]["pool_matched"] > 0
    assert spec["accepted_tokens"] > 0


def test_a_damaged_pool_file_is_ignored_with_a_warning(embedded_target, live_server, tmp_path, capsys):
    from tsspec_serve.cli import draft_memory
    from tsspec_serve.memory import PoolStore

    path = tmp_path / "pool.bin"
    path.write_bytes(b"TSSPEC-DRAFT-POOL\n{not json")
    store = draft_memory(embedded_target, True, str(path), None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning" in err[0] and str(path) in err[0] and "ignored" in err[0]
    assert store.pools == {}
    server = live_server(_engine(embedded_target, store))
    try:
        text, spec = _ask(server)
        assert text and spec["memory"]["pool_drafts"] == 0
    finally:
        server.stop()
    again = PoolStore(store.identity, path)
    assert again.load() > 0 and again.warning is None  # the shutdown wrote a good file over it


def test_two_api_keys_do_not_share_a_pool(embedded_target, live_server):
    from tsspec_serve.api import create_app
    from tsspec_serve.memory import key_id

    engine = _engine(embedded_target, _store(None))
    server = live_server(engine, create_app(engine, api_keys=["key-a", "key-b"]))
    try:
        first, spec = _ask(server, "key-a")
        assert spec["memory"] == {**spec["memory"], "pool": key_id("key-a"), "pool_drafts": 0}
        again, spec = _ask(server, "key-a")
        assert again == first and spec["memory"]["pool_drafts"] > 0  # its own history drafts
        other, spec = _ask(server, "key-b")
        assert other == first and spec["memory"]["pool"] == key_id("key-b")
        assert spec["memory"]["pool_drafts"] == 0  # nothing of key-a's history
        assert engine.settle()
        pool_b = engine.memory.peek(key_id("key-b"))
        size = len(pool_b)
        out, spec = _ask(server, "key-b", memory=False)  # opted out: neither read nor kept
        assert engine.settle()
        assert out == first and "memory" not in spec and len(pool_b) == size
    finally:
        server.stop()
