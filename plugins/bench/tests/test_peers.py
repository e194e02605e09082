"""tsspec_bench.peers: every peer in its own process, with its own default environment.

A stand-in ``llama_cpp`` package (conftest's ``fake_llama_env``: the API surface of
llama-cpp-python) goes on the child's path, so the whole line protocol, the variant probe and
the environment rules run without the real engine."""

from __future__ import annotations

import pytest

from tsspec_bench.peers import (
    BEST,
    LOOKUP,
    PLAIN,
    PeerProcess,
    PeerRecord,
    PeerUnavailable,
    draft_tokens,
    peer_environment,
    summarise_peers,
)

def test_peer_environment_drops_openmp_wait_and_thread_settings():
    env = peer_environment({"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "PATH": "/bin", "HOME": "/h",
                            "TS_SPEC_DRAFT": "8", "TS_MTP_DRAFT": "8"})  # tsspec's own settings stay home too
    assert env == {"PATH": "/bin", "HOME": "/h"}


def test_a_peer_runs_in_its_own_process_with_its_own_environment(fake_llama_env):
    env, model = fake_llama_env
    peer = PeerProcess("llama.cpp", model, [2], threads=2, env=peer_environment(env))
    try:
        assert peer.environment == {}  # neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT reached it
        assert "OMP_WAIT_POLICY = unset" in peer.info["system"]
        assert peer.info["threads"] == peer.info["n_threads_batch"] == 2
        # 4 plain variants; 5 draft lengths x 2 APIs x flash attention off / on
        assert peer.configs[0] == "plain/generate/fa0" and len(peer.configs) == 4 + 20
        assert peer.chosen[LOOKUP] == "prompt-lookup/generate/fa0/n10"  # untuned: the engine's default
        probe = peer.tune(list(range(5)), max_tokens=6, reps=1)
        # in stages: the 4 plain variants, the 5 draft lengths, then API x flash attention at the best
        assert [p["stage"] for p in probe] == ["plain"] * 4 + ["draft length"] * 5 + ["api and flash attention"] * 4
        assert [p["variant"] for p in probe[4:9]] == [f"prompt-lookup/generate/fa0/n{n}" for n in (2, 3, 4, 6, 10)]
        assert all(p["variant"].endswith("/n3") for p in probe[9:])
        assert peer.chosen[PLAIN].startswith("plain/") and peer.chosen[PLAIN].endswith("fa1")
        assert peer.chosen[LOOKUP].startswith("prompt-lookup/") and peer.chosen[LOOKUP].endswith("/fa1/n3")
        tokens, _, _ = peer.generate(LOOKUP, [1, 2, 3], 3)  # the kept context answers
        assert tokens == [11, 12, 13]
        tokens, tps, seconds = peer.generate(PLAIN, [1, 2, 3], 5)
        assert tokens == [11, 12, 13, 14, 15] and tps > 0 and seconds > 0
        tokens, _, _ = peer.generate("plain/create_completion/fa0", [1, 2, 3], 4)
        assert tokens == [11, 12, 13, 14]
        assert peer.prefill(list(range(50)), n_batch=512, fa=0) > 0
    finally:
        peer.close()
    assert peer._proc.poll() is not None  # the child is gone


def test_a_peer_that_cannot_start_is_a_one_line_reason(tmp_path, fake_llama_env):
    env, model = fake_llama_env
    broken = tmp_path / "broken"
    (broken / "llama_cpp").mkdir(parents=True)
    (broken / "llama_cpp" / "__init__.py").write_text("raise ImportError('no engine', name='llama_cpp')\n")
    with pytest.raises(PeerUnavailable, match="llama-cpp-python"):
        PeerProcess("llama.cpp", model, [2], env=dict(env, PYTHONPATH=str(broken)))
    with pytest.raises(PeerUnavailable, match="GGUF"):
        PeerProcess("llama.cpp", tmp_path / "missing.gguf", [2], env=env)
    with pytest.raises(PeerUnavailable, match="unknown peer"):
        PeerProcess("vllm", model, [2], env=env)


def test_peer_rows_carry_the_paired_tsspec_ratio():
    def rec(config, rep, tps, ts, tokens=(1, 2)):
        return PeerRecord("llama.cpp", config, "c", "qa", rep, list(tokens), tps, 1.0, variant=config,
                          tsspec_tps=ts, tsspec_config="plain" if config == PLAIN else "ngram")

    records = [rec(PLAIN, -1, 1.0, 1.0), rec(PLAIN, 0, 100.0, 120.0), rec(PLAIN, 1, 50.0, 65.0),
               rec(LOOKUP, 0, 110.0, 220.0, (1, 3)), rec(LOOKUP, 1, 60.0, 90.0)]
    rows = summarise_peers(records, ["qa"], {"c": [1, 2]})
    plain = next(r for r in rows if r.config == PLAIN and r.cls == "all")
    lookup = next(r for r in rows if r.config == LOOKUP and r.cls == "all")
    assert plain.runs == 2 and plain.tsspec_over_this == pytest.approx((1.2 + 1.3) / 2)
    assert lookup.tsspec_over_this == pytest.approx((2.0 + 1.5) / 2) and lookup.tsspec_config == "ngram"
    assert lookup.same_as_own_plain == 1 and lookup.same_as_tsspec_plain == 1
    # the best mode per pair: lookup was faster in both rounds here, so tsspec's ngram runs against it
    best = next(r for r in rows if r.config == BEST and r.cls == "all")
    assert best.modes == {PLAIN: 0, LOOKUP: 2} and best.tsspec_over_this == lookup.tsspec_over_this


def test_the_best_mode_is_the_peers_plain_where_its_lookup_is_slower():
    def rec(config, rep, tps, ts):
        return PeerRecord("llama.cpp", config, "c", "qa", rep, [1, 2], tps, 1.0, variant=config,
                          tsspec_tps=ts, tsspec_config="plain" if config == PLAIN else "ngram")

    # round 0: lookup 75 < plain 100 (ngram 200 -> 2.0x the best); round 1: lookup 120 > plain 100 (240 -> 2.0x)
    records = [rec(PLAIN, 0, 100.0, 120.0), rec(LOOKUP, 0, 75.0, 200.0), rec(PLAIN, 1, 100.0, 120.0),
               rec(LOOKUP, 1, 120.0, 240.0)]
    best = next(r for r in summarise_peers(records, ["qa"], {}) if r.config == BEST and r.cls == "qa")
    assert best.modes == {PLAIN: 1, LOOKUP: 1} and best.runs == 2
    assert best.tsspec_over_this == pytest.approx(2.0) and best.tokens_per_second == pytest.approx(110.0)


def test_draft_length_is_read_from_the_variant_name():
    from tsspec_bench.peer_worker import draft_tokens
    from tsspec_bench.peers import _other_fields

    assert draft_tokens("prompt-lookup/n5") == 5 and draft_tokens("prompt-lookup") is None
    assert draft_tokens("plain/generate/fa1") is None
    assert _other_fields("prompt-lookup/create_completion/fa1/n10") == ("prompt-lookup", "create_completion", "fa1")


def test_probe_runs_keep_the_prompt_and_only_the_chosen_contexts_stay(tmp_path, fake_llama_env, monkeypatch):
    env, model = fake_llama_env
    monkeypatch.syspath_prepend(env["PYTHONPATH"])
    monkeypatch.delitem(__import__("sys").modules, "llama_cpp", raising=False)
    monkeypatch.delitem(__import__("sys").modules, "llama_cpp.llama_speculative", raising=False)
    from tsspec_bench.peer_worker import LlamaCppEngine

    engine = LlamaCppEngine(str(model), 1)
    for config in ("prompt-lookup/generate/fa0/n3", "prompt-lookup/generate/fa1/n3", "prompt-lookup/generate/fa0/n6"):
        engine.generate(config, [1, 2], 2, [2])
    context = engine.contexts[(3, 0, 512)]
    # llama-cpp-python sizes its logits array from the argument: a draft model needs it True
    assert context.logits_all is True and engine.contexts[(0, 0, 512)].logits_all is False
    resets = context.resets
    engine.generate("prompt-lookup/generate/fa0/n3", [1, 2], 2, [2], reuse_prompt=True)  # a probe run
    assert context.resets == resets
    engine.generate("prompt-lookup/generate/fa0/n3", [1, 2], 2, [2])  # a measured run prefills again
    assert context.resets == resets + 1
    dropped = [c for k, c in engine.contexts.items() if k[0] in (6,) or k[:2] == (3, 0)]
    engine.keep(["plain/generate/fa0", "prompt-lookup/generate/fa1/n3"])
    assert sorted(engine.contexts) == [(0, 0, 512), (3, 1, 512)]  # the plain (prefill) one stays
    assert all(c.closed for c in dropped)


def test_a_probe_run_ends_at_its_time_limit(fake_llama_env):
    env, model = fake_llama_env
    peer = PeerProcess("llama.cpp", model, [2], threads=1, env=peer_environment(env))
    try:
        tokens, tps, seconds = peer.generate("plain/generate/fa0", [1, 2], 10_000, max_seconds=0.2)
        assert 0 < len(tokens) < 10_000 and seconds < 5 and tps > 0
    finally:
        peer.close()


def test_prompt_lookup_is_probed_on_its_own_prompt(fake_llama_env):
    env, model = fake_llama_env
    peer = PeerProcess("llama.cpp", model, [2], threads=1, env=peer_environment(env))
    seen = []
    generate = peer.generate

    def recording(config, prompt_ids, *args, **kwargs):
        seen.append((config.split("/")[0], tuple(prompt_ids)))
        return generate(config, prompt_ids, *args, **kwargs)

    peer.generate = recording
    try:
        peer.tune([1, 2, 3], lookup_prompt_ids=[7, 8, 9], max_tokens=3, reps=1)
    finally:
        peer.close()
    assert {ids for kind, ids in seen if kind == PLAIN} == {(1, 2, 3)}
    assert {ids for kind, ids in seen if kind == LOOKUP} == {(7, 8, 9)}


def test_a_variant_that_fails_in_the_probe_is_dropped_not_the_peer(fake_llama_env):
    """The worker answers an error for one variant and stays up: the probe goes on without that
    variant (named in probe_errors) and still chooses the fastest of the others."""
    env, model = fake_llama_env
    peer = PeerProcess("llama.cpp", model, [2], threads=1, env=peer_environment(env))
    broken = "prompt-lookup/generate/fa0/n3"  # the fake's fastest length: it must not be chosen
    generate = peer.generate

    def failing(config, *args, **kwargs):
        if config == broken:
            raise PeerUnavailable("ValueError: Failed to create llama_context")
        return generate(config, *args, **kwargs)

    peer.generate = failing
    try:
        peer.tune([1, 2, 3], max_tokens=3, reps=1)
        assert set(peer.probe_errors) == {broken}
        assert peer.chosen[LOOKUP] != broken and draft_tokens(peer.chosen[LOOKUP]) is not None
        assert broken not in {p["variant"] for p in peer.probe}
        assert peer.describe()["probe_errors"] == {broken: "ValueError: Failed to create llama_context"}
        tokens, tps, _ = peer.generate(LOOKUP, [1, 2, 3], 3)  # the peer still serves
        assert tokens and tps > 0
    finally:
        peer.close()
