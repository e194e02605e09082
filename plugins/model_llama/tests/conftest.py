"""Fixtures: tiny random HF llamas written as GGUF, the embedded model, transformers' copy of it."""

from __future__ import annotations

import os

import pytest
import torch

from tsspec.testing_fixtures import cli_state  # noqa: F401  (the CLI's state, restored after main)

TINY = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
WEIGHT_STD = 0.15  # larger than HF's init so attention, RoPE and norms all move the logits


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """Weight caches of these tests go to a temporary directory, never ~/.cache."""
    previous = os.environ.get("TSSPEC_CACHE_DIR")
    os.environ["TSSPEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("weight-cache"))
    yield
    if previous is None:
        os.environ.pop("TSSPEC_CACHE_DIR", None)
    else:
        os.environ["TSSPEC_CACHE_DIR"] = previous


def make_hf_llama(seed: int = 0, **overrides):
    """A random HF LlamaForCausalLM with every weight drawn (norms around 1)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn_like(param) * WEIGHT_STD + (1.0 if "norm" in name else 0.0))
    return model


@pytest.fixture
def tiny(tmp_path):
    """tiny(**config_overrides, dtype=None, rope_freqs=None, quantize=None) -> (hf_model, target,
    gguf_path); ``quantize`` as ``write_llama_gguf`` takes it."""
    from tsspec_model_llama import load_llama
    from tsspec_model_llama.convert import write_llama_gguf

    counter = iter(range(1000))

    def build(*, dtype=None, rope_freqs=None, seed=0, quantize=None, **overrides):
        model = make_hf_llama(seed, **overrides)
        path = write_llama_gguf(
            tmp_path / f"tiny{next(counter)}.gguf", model, rope_freqs=rope_freqs, quantize=quantize
        )
        return model, load_llama(path, {"dtype": dtype}), path

    return build


@pytest.fixture(scope="session")
def embedded_path():
    from tsspec_gguf.embedded import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def embedded_target(embedded_path):
    from tsspec_model_llama import load_llama

    return load_llama(embedded_path)


@pytest.fixture(scope="session")
def hf_embedded(embedded_path):
    """transformers' own load of the embedded GGUF (20-60 s: once per session)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(embedded_path), gguf_file=os.path.basename(embedded_path), dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One intra-op thread per test module: on a shared 2-core machine two OpenMP threads wait
    on each other at every barrier when another process holds a core (a 10-50x slowdown of the
    many small ops of a decode step); results do not depend on it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
