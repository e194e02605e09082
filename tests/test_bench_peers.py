"""tsspec.bench.peers: every peer in its own process, with its own default environment.

A stand-in ``llama_cpp`` package (same API surface as llama-cpp-python: Llama.generate,
create_completion, eval, tokenize) goes on the child's path, so the whole line protocol, the
variant probe and the environment rules run without the real engine."""

from __future__ import annotations

import os
import textwrap

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

FAKE_LLAMA_CPP = '''
import os, time
__version__ = "0.0-test"

def llama_print_system_info():
    return b"AVX2 = 1 | OMP_WAIT_POLICY = " + os.environ.get("OMP_WAIT_POLICY", "unset").encode()

class Llama:
    def __init__(self, model_path, n_ctx, n_threads, n_threads_batch, n_batch, flash_attn, verbose, seed,
                 logits_all=False, draft_model=None):
        self.fa, self.lookup = flash_attn, draft_model is not None
        self.n_tokens = 0

    def token_eos(self):
        return 2

    def reset(self):
        self.n_tokens = 0

    def eval(self, ids):
        time.sleep(0.001 * len(ids))
        self.n_tokens += len(ids)

    def generate(self, ids, **kw):
        self.eval(ids)
        t = 10
        while True:
            # flash attention "off" is slower here, so the probe must choose fa1
            time.sleep(0.004 if not self.fa else 0.001)
            t += 1
            yield t

    def create_completion(self, ids, max_tokens, stream, **kw):
        for i, t in zip(range(max_tokens), self.generate(ids)):
            yield {"choices": [{"text": " w%d" % t}]}

    def tokenize(self, data, add_bos=False, special=True):
        return [int(w[1:]) for w in data.decode().split()]
'''
FAKE_SPECULATIVE = '''
class LlamaPromptLookupDecoding:
    def __init__(self, num_pred_tokens):
        self.num_pred_tokens = num_pred_tokens
'''


@pytest.fixture
def fake_llama_env(tmp_path):
    package = tmp_path / "site" / "llama_cpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(FAKE_LLAMA_CPP))
    (package / "llama_speculative.py").write_text(textwrap.dedent(FAKE_SPECULATIVE))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), OMP_WAIT_POLICY="PASSIVE", GOMP_SPINCOUNT="0")
    return env, model


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
