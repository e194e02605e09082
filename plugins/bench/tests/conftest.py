"""Fixtures for the bench's tests."""

from __future__ import annotations

import os
import textwrap

import pytest
from tsspec.testing_fixtures import _one_torch_thread, cli_state  # noqa: F401  (shared fixtures)


FAKE_LLAMA_CPP = '''
import os, time
__version__ = "0.0-test"

def llama_print_system_info():
    return b"AVX2 = 1 | OMP_WAIT_POLICY = " + os.environ.get("OMP_WAIT_POLICY", "unset").encode()

class Llama:
    def __init__(self, model_path, n_ctx, n_threads, n_threads_batch, n_batch, flash_attn, verbose, seed,
                 logits_all=False, draft_model=None):
        self.fa, self.lookup = flash_attn, draft_model is not None
        self.draft = 0 if draft_model is None else draft_model.num_pred_tokens
        self.logits_all = logits_all
        self.n_tokens = 0
        self.resets = 0
        self.closed = False

    def close(self):
        self.closed = True

    def token_eos(self):
        return 2

    def reset(self):
        self.n_tokens = 0
        self.resets += 1

    def eval(self, ids):
        time.sleep(0.001 * len(ids))
        self.n_tokens += len(ids)

    def generate(self, ids, **kw):
        self.eval(ids)
        t = 10
        while True:
            # flash attention "off" is slower here, so the probe must choose fa1; prompt lookup
            # is fastest with 3 tokens a draft
            time.sleep((0.004 if not self.fa else 0.001) + 0.001 * abs(self.draft - 3) * self.lookup)
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
    """(environment with a stand-in llama_cpp package on PYTHONPATH, a model path): peers run
    their whole protocol without the real engine. The environment sets OpenMP settings that a
    peer must never see."""
    package = tmp_path / "site" / "llama_cpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(FAKE_LLAMA_CPP))
    (package / "llama_speculative.py").write_text(textwrap.dedent(FAKE_SPECULATIVE))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), OMP_WAIT_POLICY="PASSIVE", GOMP_SPINCOUNT="0")
    return env, model
