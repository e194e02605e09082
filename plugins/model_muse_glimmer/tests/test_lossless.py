"""Speculative == plain through the shared loop on a converted tiny Muse-Glimmer: ``ngram`` with
no drafter (the trunk verifies on its own), greedy and seeded sampling, and the CLI's listing."""

from __future__ import annotations

import json

import pytest

from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import assert_lossless

# repeats so prompt lookup finds matches; the window (6) is shorter than what is generated
PROMPT = [5, 9, 2, 3, 17, 8, 4, 5, 9, 2, 3, 17]
LOOPY = dict(seed=5, vocab_size=32, weight_std=0.5)  # sharp logits: the output repeats itself
SAMPLINGS = {"greedy": None, "seeded": SamplingParams(temperature=0.8, top_k=20, seed=7)}


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_ngram_is_lossless_without_a_drafter(tiny, sampling):
    from tsspec_model_muse_glimmer import load_muse_glimmer
    from tsspec_ngram.speculator import make_ngram

    _, _, path = tiny(**LOOPY)
    options = SpeculationOptions(spec_type="ngram", pmin=0.0, adaptive=False)
    _, spec = assert_lossless(lambda: load_muse_glimmer(path), lambda t: make_ngram(t, options), PROMPT,
                              max_tokens=40, sampling=SAMPLINGS[sampling], options=options)
    stats = spec.stats
    assert stats.draft_tokens > 0 and stats.faults == 0
    if sampling == "greedy":  # accepted and rejected drafts both happened: rollbacks were exercised
        assert 0 < stats.accepted_tokens < stats.draft_tokens


def test_list_speculators_says_ngram_serves(tiny, capsys):
    from tsspec.cli.app import main

    _, _, path = tiny()
    try:
        main(["list-speculators", "--model", str(path), "--json"])
    except SystemExit as exc:
        assert not exc.code
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["ngram"]["status"] == "serves"
    assert rows["block"]["status"] != "serves" and rows["block"]["code"] == "no_draft_head"
