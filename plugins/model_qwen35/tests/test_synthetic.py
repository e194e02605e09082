"""The random in-memory models the benchmark uses load through the GGUF loader and decode
losslessly on both rollback paths."""

from __future__ import annotations

import pytest

from tsspec.testing import RandomSpeculator, assert_lossless

from tsspec_model_qwen35.loader import load_from_source
from tsspec_model_qwen35.source import MemorySource
from tsspec_model_qwen35.synthetic import SyntheticSpec, parameter_count, random_model

TINY = SyntheticSpec(vocab_size=64, hidden_size=32, num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16,
                     rope_dims=8, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8, ffn_size=48, nextn=True)


def test_random_model_loads_with_its_head():
    arch, meta, tensors = random_model(TINY, seed=1)
    target = load_from_source(MemorySource(arch, meta, tensors))
    assert target.hp.recurrent == (True, True, True, False)
    assert target.hp.v_order == "tiled" and target.draft_head is not None
    assert parameter_count(tensors) > 64 * 32 * 2


@pytest.mark.parametrize("per_row", [True, False])
def test_random_model_is_lossless(per_row):
    arch, meta, tensors = random_model(TINY, seed=2)
    make = lambda: load_from_source(MemorySource(arch, meta, tensors), dtype="float64", per_row_snapshots=per_row)
    assert_lossless(make, lambda t: RandomSpeculator(64, max_draft_tokens=3, seed=1), [1, 2, 3, 4, 5], max_tokens=16)
