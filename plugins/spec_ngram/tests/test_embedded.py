"""Lossless on the embedded model (SmolLM2-135M-Instruct) with a prompt the answer quotes.

float64 weights: a multi-row verify is then bit-near one-row decoding, so no near-tie argmax
can flip between the plain and the speculative run (in float32 it can).
"""

from __future__ import annotations

import os

import pytest
import torch

from tsspec.runtime.generation import encode_prompt
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import assert_lossless
from tsspec_ngram import make_ngram

pytestmark = pytest.mark.slow

MESSAGE = (
    "Repeat this code exactly, then say what it computes.\n```python\n"
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n```"
)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    pytest.importorskip("tsspec_model_llama")
    from tsspec.errors import ModelLoadError
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime.loading import load_model

    try:
        path = embedded_model_path()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    previous_threads = torch.get_num_threads()
    previous_cache = os.environ.get("TSSPEC_CACHE_DIR")
    torch.set_num_threads(1)  # a second OpenMP thread only spins on a busy 2-core machine
    os.environ["TSSPEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("weight-cache"))  # never ~/.cache
    try:
        yield load_model(path, dtype="float64")
    finally:
        torch.set_num_threads(previous_threads)
        if previous_cache is None:
            os.environ.pop("TSSPEC_CACHE_DIR", None)
        else:
            os.environ["TSSPEC_CACHE_DIR"] = previous_cache


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=0.3, top_k=8, seed=5)], ids=["greedy", "sampled"]
)
def test_lossless_on_the_embedded_model(embedded, sampling):
    ids = encode_prompt(embedded, MESSAGE, chat=True)
    plain, spec = assert_lossless(
        lambda: embedded,
        lambda target: make_ngram(target, SpeculationOptions(spec_type="ngram")),
        ids,
        max_tokens=24,
        sampling=sampling,
    )
    assert spec.speculator == "ngram"
    assert spec.stats.accepted_tokens > 0
