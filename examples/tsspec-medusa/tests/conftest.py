"""Fixtures for the tsspec-medusa tests.

The tests run against an installed plugin (``pip install -e .``) or, from a checkout, against
``src/`` directly: tsspec's own test suite runs them that way without installing the example.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("tsspec_medusa") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import tsspec  # noqa: E402
from tsspec.testing import ToyTarget  # noqa: E402
from tsspec.testing_fixtures import _isolated_environ  # noqa: E402,F401  (no TS_* settings leak in or out)

import tsspec_medusa  # noqa: E402

TOY_HIDDEN = 16  # ToyTarget's defaults
TOY_VOCAB = 32
FIT_RIDGE = 1e-3  # ridge term of the least-squares fit of the fitted heads
FIT_SHARPNESS = 20.0  # scales the fitted logits so the heads are confident where they fit


@pytest.fixture
def random_medusa(tmp_path):
    """A random-weight Medusa file sized for the default ToyTarget."""
    return tsspec_medusa.write_random_medusa(tmp_path / "random.gguf", TOY_HIDDEN, TOY_VOCAB, heads=3, seed=0)


def fitted_heads(make_target, prompt, n_tokens: int, heads: int = 3) -> tsspec_medusa.MedusaHeads:
    """Heads fitted (ridge least squares) to the toy's own plain continuation of ``prompt``.

    Residual blocks are zero (so each block is the identity: x + silu(0) = x) and head k's
    projection maps the hidden row at t to the token at t+k+2 on that sequence: the heads are
    right often enough to exercise accepted drafts, partial accepts and corrections."""
    from tsspec.testing import plain_tokens

    target = make_target()
    ids = target.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    seq = ids + plain_tokens(target, ids, n_tokens)
    fresh = make_target()
    _, hidden = fresh.spec_forward(seq, all_logits_rows=True, want_hidden=True)  # [n, H]
    x_all = hidden.to(torch.float64)
    size, vocab = x_all.shape[1], fresh.config.vocab_size
    out = torch.zeros(heads, vocab, size, dtype=torch.float64)
    for k in range(heads):
        x = x_all[: len(seq) - k - 2]  # rows t ..
        y = torch.nn.functional.one_hot(torch.tensor(seq[k + 2 :]), vocab).to(torch.float64)  # tokens t+k+2
        gram = x.T @ x + FIT_RIDGE * torch.eye(size, dtype=torch.float64)
        out[k] = FIT_SHARPNESS * torch.linalg.solve(gram, x.T @ y).T  # [V, H]
    zeros_w = torch.zeros(heads, 1, size, size)
    zeros_b = torch.zeros(heads, 1, size)
    return tsspec_medusa.MedusaHeads(zeros_w, zeros_b, out.to(torch.float32))


@pytest.fixture(name="fitted_heads")
def _fitted_heads():
    """``fitted_heads(make_target, prompt, n_tokens, heads=3)`` (test modules cannot import
    conftest under --import-mode=importlib)."""
    return fitted_heads


@pytest.fixture
def options_for():
    def make(path, **kw):
        return tsspec.SpeculationOptions(spec_type="medusa", spec_draft_model=str(path), adaptive=False, **kw)

    return make
