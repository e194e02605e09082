"""Speculative == plain through the shared loop on a converted tiny Gemma 4: ``ngram`` with no
drafter (the trunk verifies on its own) and ``draft-head`` with the assistant (ordered
embeddings), greedy and seeded; what list-speculators says with and without the assistant."""

from __future__ import annotations

import json

import pytest

from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import assert_lossless
from tsspec_model_gemma4.assistant import attach_assistant
from tsspec_model_gemma4.loader import load_gemma4

PROMPT = [5, 9, 2, 3, 17, 8, 4, 5, 9, 2, 3, 17, 8]  # repeats, so prompt lookup finds matches
SAMPLINGS = {"greedy": None, "seeded": SamplingParams(temperature=0.8, top_k=20, seed=7)}


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_ngram_is_lossless_without_an_assistant(files, sampling):
    from tsspec_ngram.speculator import make_ngram

    _, path = files["trunk"]
    options = SpeculationOptions(spec_type="ngram", pmin=0.0, adaptive=False, draft=4)
    _, spec = assert_lossless(lambda: load_gemma4(path), lambda t: make_ngram(t, options), PROMPT,
                              max_tokens=24, sampling=SAMPLINGS[sampling], options=options)
    assert spec.stats.draft_tokens > 0 and spec.stats.faults == 0


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_draft_head_with_the_assistant_is_lossless(files, sampling):
    from tsspec_draft_head import make_draft_head

    _, path = files["trunk"]
    _, assistant = files["ordered"]

    def target():
        t = load_gemma4(path)
        t.draft_head = attach_assistant(t, assistant)
        return t

    options = SpeculationOptions(spec_type="draft-head", pmin=0.0, adaptive=False, draft=3)
    _, spec = assert_lossless(target, lambda t: make_draft_head(t, options), PROMPT, max_tokens=24,
                              sampling=SAMPLINGS[sampling], options=options)
    assert spec.speculator == "draft-head"
    assert spec.stats.draft_tokens > 0 and spec.stats.faults == 0


def test_accepted_drafts_of_an_agreeing_assistant_are_lossless(files, tmp_path):
    """All drafts accepted (greedy: the trunk repeats a token, the echo assistant drafts it) and
    partial accepts (seeded) through the real assistant code."""
    import gemma4_tiny as tiny
    from tsspec_draft_head import make_draft_head

    model, path = files["trunk"]
    echo = tiny.write_echo_assistant(model, tmp_path / "echo.gguf")

    def target():
        t = load_gemma4(path)
        t.draft_head = attach_assistant(t, echo)
        return t

    options = SpeculationOptions(spec_type="draft-head", pmin=0.0, adaptive=False, draft=3)
    accepted = {}
    for name, sampling in SAMPLINGS.items():
        _, spec = assert_lossless(target, lambda t: make_draft_head(t, options), PROMPT, max_tokens=24,
                                  sampling=sampling, options=options)
        accepted[name] = (spec.stats.accepted_tokens, spec.stats.draft_tokens)
    assert accepted["greedy"][0] > 0  # here every draft lands (the trunk repeats one token): bonus rows
    assert accepted["seeded"][0] < accepted["seeded"][1]  # here some land, the rest are rolled back


def _listing(capsys, *args) -> dict:
    from tsspec.cli.app import main

    try:
        main(["list-speculators", *args, "--json"])
    except SystemExit as exc:
        assert not exc.code
    return {r["name"]: r for r in json.loads(capsys.readouterr().out)}


def test_list_speculators_names_the_missing_assistant(files, capsys):
    _, path = files["trunk"]
    rows = _listing(capsys, "--model", str(path))
    assert rows["ngram"]["status"] == "serves"
    assert rows["draft-head"]["code"] == "no_draft_head"
    assert "assistant missing" in rows["draft-head"]["reason"]


def test_spec_draft_model_attaches_the_assistant_by_its_architecture(files):
    import tsspec
    from tsspec_model_gemma4.assistant import Gemma4Assistant

    _, path = files["trunk"]
    options = tsspec.SpeculationOptions(spec_type="draft-head", pmin=0.0, adaptive=False, draft=2)
    target = tsspec.load_model(str(path), draft_model=str(files["assistant"][1]), options=options)
    assert isinstance(target.draft_head, Gemma4Assistant)
    result = tsspec.generate(target, PROMPT, options, max_tokens=6)
    assert result.speculator == "draft-head" and result.stats.draft_tokens > 0


def test_the_assistant_arms_after_a_reused_prefix(files):
    """No state of its own: after the trunk reuses a cached prefix the head drafts at once
    (CanArmAfterPrefixReuse), and the turn equals plain decoding of the same prompt."""
    from tsspec.testing import plain_tokens, turns
    from tsspec_draft_head import make_draft_head

    _, path = files["trunk"]
    target = load_gemma4(path)
    target.draft_head = attach_assistant(target, files["assistant"][1])
    speculator = make_draft_head(target, SpeculationOptions(spec_type="draft-head", pmin=0.0, draft=3))
    assert speculator.can_arm_after_prefix_reuse
    second = PROMPT + plain_tokens(load_gemma4(path), PROMPT, 6) + [7, 11]  # a chat's next turn
    (first, _), (tokens, stats) = turns(target, speculator, [PROMPT, second], max_tokens=[6, 8])
    assert second[: len(PROMPT) + 6] == PROMPT + first
    assert stats.prefix_reused > 0 and stats.armed_after_reuse
    assert tokens == plain_tokens(load_gemma4(path), second, 8)
