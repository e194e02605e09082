"""Speculation with Medusa heads never changes a token: greedy, seeded sampling, penalties,
both rollback regimes of the toy target, and a KV prefix the speculator never saw."""

from __future__ import annotations

import pytest

import tsspec
from tsspec.testing import ToyTarget, assert_lossless, plain_tokens, plugin_catalog, turns
from tsspec_medusa import MedusaSpeculator, make_medusa

PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown"
SAMPLINGS = {
    "greedy": None,
    "sampled": tsspec.SamplingParams(temperature=0.8, top_k=20, seed=3),
    "penalised": tsspec.SamplingParams(temperature=0.7, top_p=0.9, repeat_penalty=1.3, seed=11),
}


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("per_row", [False, True])
def test_random_heads_are_lossless(random_medusa, options_for, sampling, per_row):
    options = options_for(random_medusa)
    plain, spec = assert_lossless(
        lambda: ToyTarget(per_row_snapshots=per_row),
        lambda target: make_medusa(target, options),
        PROMPT,
        max_tokens=40,
        sampling=SAMPLINGS[sampling],
        options=options,
    )
    assert spec.speculator == "medusa" and spec.stats.draft_tokens > 0 and spec.stats.faults == 0


@pytest.mark.parametrize("sampling", ["greedy", "sampled"])
def test_fitted_heads_are_accepted_and_still_lossless(fitted_heads, sampling):
    heads = fitted_heads(ToyTarget, PROMPT, 48)
    plain, spec = assert_lossless(
        ToyTarget,
        lambda target: MedusaSpeculator(heads),
        PROMPT,
        max_tokens=48,
        sampling=SAMPLINGS[sampling],
        options=tsspec.SpeculationOptions(adaptive=False),
    )
    stats = spec.stats
    assert stats.accepted_tokens > 0 and stats.accepted_tokens < stats.draft_tokens  # accepts and rejects
    assert stats.verify_steps < len(spec.tokens)  # fewer trunk passes than tokens


def test_the_gate_trades_drafts_for_nothing_else(fitted_heads):
    heads = fitted_heads(ToyTarget, PROMPT, 48)
    runs = {}
    for gate in (0.0, 0.5):
        plain, spec = assert_lossless(
            ToyTarget, lambda target: MedusaSpeculator(heads, min_draft_prob=gate), PROMPT, max_tokens=48,
            options=tsspec.SpeculationOptions(adaptive=False),
        )
        runs[gate] = spec.stats
    assert runs[0.5].draft_tokens < runs[0.0].draft_tokens


def test_prefix_reuse_arms_and_stays_lossless(random_medusa):
    """A second request sharing a prefix reuses the KV; Medusa arms anyway (it is stateless)."""
    target = ToyTarget(recurrent=False)  # a pure-KV trunk can rewind to a shared prefix
    speculator = make_medusa(target, tsspec.SpeculationOptions(spec_draft_model=str(random_medusa)))
    first = target.tokenizer.encode(PROMPT)
    second = first + target.tokenizer.encode(" jumps again")
    (_, _), (out, stats) = turns(target, speculator, [first, second], max_tokens=[12, 20], window=3)
    assert stats.prefix_reused > 0 and stats.armed_after_reuse  # armed after the reused prefix
    assert out == plain_tokens(ToyTarget(recurrent=False), second, 20)


def test_through_the_registry_and_generate(random_medusa):
    import tsspec_medusa

    registry = plugin_catalog({"medusa": tsspec_medusa}).speculators
    options = tsspec.SpeculationOptions(spec_type="medusa", spec_draft_model=str(random_medusa))
    spec = tsspec.generate(ToyTarget(), PROMPT, options, max_tokens=24, registry=registry)
    plain = tsspec.generate(ToyTarget(), PROMPT, tsspec.SpeculationOptions(enabled=False), max_tokens=24)
    assert spec.speculator == "medusa" and spec.decline is None and spec.tokens == plain.tokens
