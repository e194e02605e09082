"""Lossless generation through the shared loop on both rollback paths: speculative output equals
plain output token for token, with toy speculators, n-gram and the model's own MTP head (random
weights: acceptance near zero is fine, the output must not change). float64 models, so a
multi-row verify and one-row decoding agree to ~1e-15 and token equality is a fair demand; and the
shipped float32 CPU trunk (matrices and attention on the row-invariant kernels), bit for bit."""

from __future__ import annotations

import pytest
from tsspec_gguf import native

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import OracleSpeculator, RandomSpeculator, assert_lossless

PATHS = [True, False]
PATH_IDS = ["snapshots", "restore"]
EXPECTED_MODE = {True: "committed", False: "reforward"}
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_k=20, seed=11)
MAX_TOKENS = 24


def _maker(make_target, arch, per_row):
    return lambda: make_target(arch, dtype="float64", per_row_snapshots=per_row)


def _check_modes(spec, per_row, *, rejections: bool = True):
    """The rollback path that ran: per-row commits, or restore + re-forward (only seen when some
    verify was partially rejected; a verify kept whole is 'all' on that path)."""
    modes = spec.stats.rollback_modes
    assert spec.stats.verify_steps > 0, "speculation never verified anything"
    if rejections or per_row:
        assert EXPECTED_MODE[per_row] in modes, modes
    assert EXPECTED_MODE[not per_row] not in modes, modes


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("per_row", PATHS, ids=PATH_IDS)
def test_oracle_speculator_at_partial_acceptance(make_target, sequence, per_row, sampling):
    prompt = sequence[:10]
    make = _maker(make_target, "qwen35", per_row)
    plain = generate(make(), prompt, SpeculationOptions(enabled=False), max_tokens=MAX_TOKENS, sampling=sampling)
    reference = prompt + plain.tokens
    _, spec = assert_lossless(
        make,
        lambda t: OracleSpeculator(reference, corrupt=0.4, vocab_size=t.config.vocab_size, max_draft_tokens=3),
        prompt, max_tokens=MAX_TOKENS, sampling=sampling,
    )
    _check_modes(spec, per_row)
    assert 0 < spec.stats.accepted_tokens < spec.stats.draft_tokens


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
@pytest.mark.parametrize("per_row", PATHS, ids=PATH_IDS)
def test_random_speculator(make_target, sequence, arch, per_row):
    _, spec = assert_lossless(
        _maker(make_target, arch, per_row),
        lambda t: RandomSpeculator(t.config.vocab_size, max_draft_tokens=3, seed=3),
        sequence[:8], max_tokens=MAX_TOKENS,
    )
    _check_modes(spec, per_row)


@pytest.mark.parametrize("per_row", PATHS, ids=PATH_IDS)
def test_ngram(make_target, per_row):
    """``--spec-type ngram`` on a checkpoint without any drafter (the trunk is drafter-independent)."""
    prompt = [5, 6, 7, 8, 9, 10, 11] * 4
    _, spec = assert_lossless(
        _maker(make_target, "qwen35moe", per_row), lambda t: None, prompt, max_tokens=MAX_TOKENS,
        options=SpeculationOptions(spec_type="ngram", adaptive=False),
    )
    assert spec.speculator == "ngram", spec.decline
    _check_modes(spec, per_row, rejections=False)  # the random model loops: drafts often all land


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
@pytest.mark.parametrize("per_row", PATHS, ids=PATH_IDS)
def test_mtp_head(make_target, sequence, arch, per_row):
    """The model's own NextN head through the draft-head algorithm (gate off so it always drafts)."""
    _, spec = assert_lossless(
        _maker(make_target, arch, per_row), lambda t: None, sequence[:9], max_tokens=MAX_TOKENS,
        options=SpeculationOptions(spec_type="draft-head", pmin=0.0, adaptive=False),
    )
    assert spec.speculator == "draft-head", spec.decline
    _check_modes(spec, per_row)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("per_row", PATHS, ids=PATH_IDS)
@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next"])
def test_float32_is_bit_exact(make_target, sequence, arch, per_row, sampling):
    """The shipped precision: float32 on the row-invariant kernels, speculative == plain exactly."""
    if not native.available():
        pytest.skip("the compiled CPU kernels are not built")
    make = lambda: make_target(arch, dtype="float32", per_row_snapshots=per_row)  # noqa: E731
    assert make().config.extra["lossless"].startswith("bit-exact")
    plain = generate(make(), sequence[:10], SpeculationOptions(enabled=False), max_tokens=MAX_TOKENS, sampling=sampling)
    reference = sequence[:10] + plain.tokens
    _, spec = assert_lossless(
        make,
        lambda t: OracleSpeculator(reference, corrupt=0.4, vocab_size=t.config.vocab_size, max_draft_tokens=4),
        sequence[:10], max_tokens=MAX_TOKENS, sampling=sampling,
    )
    _check_modes(spec, per_row)
    assert 0 < spec.stats.accepted_tokens < spec.stats.draft_tokens


def test_float32_on_torch_matmuls_says_it_is_not_bit_exact(make_target):
    target = make_target("qwen35", dtype="float32", row_invariant=False)
    assert target.config.extra["lossless"].startswith("not bit-exact")
