"""Lossless in the precision each path ships in, on the embedded model (SmolLM2-135M-Instruct).

Generate-level: plain and ngram-speculative decoding of the same chat prompt, greedy and seeded
(temperature 0.8, top-p 0.95), must give the same tokens. Each ``--dtype`` is loaded as a user
gets it: float32 (dense torch GEMMs), int8 (block kernel, int8 activations), float32-blocks,
bfloat16 and float16 (every matrix kept at 16 bits on the block kernel, float32 math) and the
default (block kernel, float32 math).
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
SAMPLINGS = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.95, seed=3)]


@pytest.fixture(scope="module")
def embedded_path(tmp_path_factory):
    pytest.importorskip("tsspec_model_llama")
    from tsspec.errors import ModelLoadError
    from tsspec_gguf.embedded import embedded_model_path

    try:
        path = embedded_model_path()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    previous_threads = torch.get_num_threads()
    previous_cache = os.environ.get("TSSPEC_CACHE_DIR")
    torch.set_num_threads(1)
    os.environ["TSSPEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("weight-cache"))  # never ~/.cache
    try:
        yield path
    finally:
        torch.set_num_threads(previous_threads)
        if previous_cache is None:
            os.environ.pop("TSSPEC_CACHE_DIR", None)
        else:
            os.environ["TSSPEC_CACHE_DIR"] = previous_cache


@pytest.mark.parametrize("dtype", DTYPES := ["float32", "int8", "float32-blocks", "bfloat16", "float16", None])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_lossless_in_the_shipped_precision(embedded_path, dtype, sampling):
    from tsspec.runtime.loading import load_model

    target = load_model(embedded_path, dtype=dtype) if dtype else load_model(embedded_path)
    ids = encode_prompt(target, MESSAGE, chat=True)
    _, spec = assert_lossless(
        lambda: target,
        lambda t: make_ngram(t, SpeculationOptions(spec_type="ngram")),
        ids,
        max_tokens=32,
        sampling=sampling,
    )
    assert spec.stats.accepted_tokens > 0  # the verify rows were exercised, not only one-row steps
