"""MedusaHeads maths against an independent torch.nn formulation of the original Medusa head."""

from __future__ import annotations

import pytest
import torch

from tsspec_medusa import MedusaHeads, heads_from_medusa_state_dict

H, V = 12, 20


class ResBlock(torch.nn.Module):
    """x + silu(Linear(x)), the original Medusa residual block."""

    def __init__(self, hidden):
        super().__init__()
        self.linear = torch.nn.Linear(hidden, hidden)
        self.act = torch.nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


def reference_heads(k: int, layers: int, seed: int = 0) -> torch.nn.ModuleList:
    torch.manual_seed(seed)
    return torch.nn.ModuleList(
        torch.nn.Sequential(*[ResBlock(H) for _ in range(layers)], torch.nn.Linear(H, V, bias=False))
        for _ in range(k)
    )


@pytest.mark.parametrize("k,layers", [(1, 1), (3, 1), (4, 2), (2, 0)])
def test_logits_match_the_reference_module(k, layers):
    ref = reference_heads(k, layers, seed=k * 10 + layers)
    heads = heads_from_medusa_state_dict(ref.state_dict())
    assert (heads.head_count, heads.layers_per_head, heads.hidden_size, heads.vocab_size) == (k, layers, H, V)
    h = torch.randn(5, H)
    with torch.no_grad():
        expected = torch.stack([head(h) for head in ref], dim=1)  # [5, k, V]
    torch.testing.assert_close(heads.logits(h), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(heads.logits(h[2]), expected[2], rtol=1e-5, atol=1e-5)


def test_first_heads_only_and_prefixed_keys():
    ref = reference_heads(3, 1)
    state = {f"medusa_head.{key}": value for key, value in ref.state_dict().items()}
    heads = heads_from_medusa_state_dict(state)
    h = torch.randn(H)
    full = heads.logits(h)
    assert full.shape == (3, V)
    torch.testing.assert_close(heads.logits(h, heads=2), full[:2])
    assert heads.logits(h, heads=0).shape == (0, V)


def test_zero_blocks_are_the_identity():
    out = torch.randn(2, V, H)
    heads = MedusaHeads(torch.zeros(2, 1, H, H), torch.zeros(2, 1, H), out)
    h = torch.randn(H)
    torch.testing.assert_close(heads.logits(h), out @ h)


def test_hidden_rows_are_cast_to_the_heads_dtype():
    heads = MedusaHeads(torch.zeros(1, 1, H, H), torch.zeros(1, 1, H), torch.randn(1, V, H))
    assert heads.logits(torch.randn(H, dtype=torch.float64)).dtype == torch.float32
    assert heads.to(dtype=torch.float64).logits(torch.randn(H)).dtype == torch.float64
    assert heads.to("cpu") is heads


@pytest.mark.parametrize(
    "res_w,res_b,out,match",
    [
        ((2, 1, H, H + 1), (2, 1, H), (2, V, H), "res_weight"),
        ((2, 1, H, H), (2, 2, H), (2, V, H), "res_bias"),
        ((2, 1, H, H), (2, 1, H), (3, V, H), "out_weight"),
        ((0, 1, H, H), (0, 1, H), (0, V, H), "at least one head"),
    ],
)
def test_shapes_are_validated(res_w, res_b, out, match):
    with pytest.raises(ValueError, match=match):
        MedusaHeads(torch.zeros(res_w), torch.zeros(res_b), torch.zeros(out))


def test_wrong_width_rows_are_refused():
    heads = MedusaHeads(torch.zeros(1, 1, H, H), torch.zeros(1, 1, H), torch.zeros(1, V, H))
    with pytest.raises(ValueError, match="width"):
        heads.logits(torch.zeros(H + 1))


def test_state_dict_errors_name_the_problem():
    good = reference_heads(2, 1).state_dict()
    with pytest.raises(ValueError, match="unexpected key"):
        heads_from_medusa_state_dict({**good, "lm_head.weight": torch.zeros(V, H)})
    missing = {k: v for k, v in good.items() if k != "1.0.linear.bias"}
    with pytest.raises(ValueError, match="residual blocks"):
        heads_from_medusa_state_dict(missing)
    with pytest.raises(ValueError, match="no head projections"):
        heads_from_medusa_state_dict({})
