"""Row invariance of the float32 CPU trunk: a k-row verify's logits equal the k one-row steps'
bit for bit on the kernels (torch's matmuls and its vectorised elementwise ops do not promise it:
on a 256-wide model their rows differ by ~1e-6)."""

from __future__ import annotations

import pytest
import torch

from tsspec_gguf import native
from tsspec_model_qwen35.loader import load_from_source
from tsspec_model_qwen35.ops import rowwise
from tsspec_model_qwen35.rowlinear import RowLinear
from tsspec_model_qwen35.source import MemorySource
from tsspec_model_qwen35.synthetic import SyntheticSpec, random_model

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels are not built")

SMALL = SyntheticSpec(vocab_size=1024, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                      rope_dims=16, num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64, ffn_size=768)


@pytest.mark.parametrize("k", [32, 48, 24])
def test_row_linear_rows_do_not_depend_on_the_call(k):
    g = torch.Generator().manual_seed(k)
    w, x = torch.randn(40, k, generator=g), torch.randn(9, k, generator=g)
    m = RowLinear(w)
    full = m(x)  # [9, 40]
    assert torch.equal(full, torch.cat([m(x[i : i + 1]) for i in range(9)]))
    torch.testing.assert_close(full, x @ w.t(), rtol=1e-5, atol=1e-5)  # zero padding changes no sum


def test_rowwise_matches_the_whole_call_in_value():
    x = torch.randn(5, 12)
    torch.testing.assert_close(rowwise(torch.sigmoid, x), torch.sigmoid(x), rtol=1e-6, atol=1e-7)
    assert torch.equal(rowwise(torch.sigmoid, x)[2:3], torch.sigmoid(x[2:3]))


@pytest.mark.parametrize("per_row", [True, False], ids=["snapshots", "restore"])
def test_verify_rows_equal_one_row_steps(per_row):
    model = random_model(SMALL, seed=1)
    prompt, draft = list(range(3, 30)), [5, 9, 17, 33, 2]

    def fresh():
        t = load_from_source(MemorySource(*model), per_row_snapshots=per_row)
        t.spec_forward(prompt, all_logits_rows=False, want_hidden=False)
        return t

    stepped = fresh()
    one = torch.cat([stepped.spec_forward([tok], all_logits_rows=False, want_hidden=False)[0] for tok in draft])
    many, _ = fresh().spec_forward(draft, all_logits_rows=True, want_hidden=False)  # [5, V]
    assert torch.equal(many, one)
