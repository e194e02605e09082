"""Tiny random Gemma 4 files, each built once per test session on first use (transformers
5.25 is the oracle)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import gemma4_tiny as tiny  # noqa: E402

MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
BUILDERS = {  # name -> (make the HF model, write its GGUF)
    # KV-shared layers, per-layer inputs, both head dims, K = V, double-wide MLP, softcap
    "trunk": (lambda: tiny.hf_target(), tiny.write_target),
    "moe": (lambda: tiny.hf_target(seed=2, **MOE), tiny.write_target),
    "assistant": (lambda: tiny.hf_assistant(), tiny.write_assistant),
    "ordered": (lambda: tiny.hf_assistant(ordered=True), tiny.write_assistant),
}


class Files:
    """``files[name]`` -> (HF model, GGUF path), built on first use."""

    def __init__(self, root: Path):
        self.root, self.built = root, {}

    def __getitem__(self, name: str):
        if name not in self.built:
            make, write = BUILDERS[name]
            model = make()
            self.built[name] = (model, write(model, self.root / f"{name}.gguf"))
        return self.built[name]


@pytest.fixture(scope="session")
def files(tmp_path_factory):
    return Files(tmp_path_factory.mktemp("gemma4"))
