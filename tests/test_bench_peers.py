"""tsspec.bench.peers: every peer in its own process, with its own default environment.

A stand-in ``llama_cpp`` package (conftest's ``fake_llama_env``: the API surface of
llama-cpp-python) goes on the child's path, so the whole line protocol, the variant probe and
the environment rules run without the real engine."""

from __future__ import annotations

import pytest

from tsspec.bench.peers import (
    LOOKUP,
    PLAIN,
    PeerProcess,
    PeerRecord,
    PeerUnavailable,
    peer_environment,
    summarise_peers,
)

def test_peer_environment_drops_openmp_wait_and_thread_settings():
    env = peer_environment({"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "PATH": "/bin", "HOME": "/h"})
    assert env == {"PATH": "/bin", "HOME": "/h"}


def test_a_peer_runs_in_its_own_process_with_its_own_environment(fake_llama_env):
    env, model = fake_llama_env
    peer = PeerProcess("llama.cpp", model, [2], threads=2, env=peer_environment(env))
    try:
        assert peer.environment == {}  # neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT reached it
        assert "OMP_WAIT_POLICY = unset" in peer.info["system"]
        assert peer.info["threads"] == peer.info["n_threads_batch"] == 2
        assert peer.configs[0] == "plain/generate/fa0" and len(peer.configs) == 8
        probe = peer.tune(list(range(5)), max_tokens=6, reps=1)
        assert len(probe) == 8
        assert peer.chosen[PLAIN].startswith("plain/") and peer.chosen[PLAIN].endswith("fa1")
        assert peer.chosen[LOOKUP].startswith("prompt-lookup/")
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
