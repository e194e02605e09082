"""``tsspec bench --families``: the option, "not installed", and a whole family run at a tiny size."""

from __future__ import annotations

import json

import pytest

import tsspec_ngram
from tsspec.errors import OptionsError
from tsspec.testing import plugin_catalog
from tsspec_bench import families
from tsspec_bench.families import CONFIGS, DRAFT_HEAD, NOT_REAL, FamilySize, parse_families, run_families

TINY = FamilySize(distill_steps=3, train_sequences=2, prompts=2, reps=1, max_tokens=6, draft=2)


def test_the_option_names_known_families_once_and_refuses_others():
    assert parse_families("glm-dsa, gemma4,glm-dsa") == ["glm-dsa", "gemma4"]
    assert parse_families(None) == []
    with pytest.raises(OptionsError, match="--families llama: choose from gemma4, glm-dsa"):
        parse_families("llama")


def test_a_family_whose_plugin_is_absent_is_not_installed():
    catalog = plugin_catalog({"ngram": tsspec_ngram})
    results = run_families(["gemma4", "glm-dsa"], catalog, TINY)
    assert [(r.family, r.status) for r in results] == [("gemma4", "not installed"), ("glm-dsa", "not installed")]
    assert "tsspec-model-gemma4" in results[0].reason and "model gemma4" in results[0].reason
    text = "\n".join(families.markdown(results))
    assert "not installed: no loaded plugin registers model glm-dsa" in text


def _installed(name: str):
    from tsspec.runtime.defaults import default_catalog

    catalog = default_catalog()
    why = families.FAMILIES[name].requirement.missing(catalog)
    if why is not None:
        pytest.skip(why)
    return catalog


def test_a_family_is_built_distilled_and_measured_against_plain():
    name = "gemma4"
    catalog = _installed(name)
    (result,) = run_families([name], catalog, TINY)
    assert result.status == "measured", result.reason
    rows = {r.config: r for r in result.rows}
    assert list(rows) == list(CONFIGS)
    assert all(r.equal_to_plain for r in result.rows)
    head = rows[DRAFT_HEAD]
    assert head.decline is None and head.speculator == DRAFT_HEAD and head.drafted > 0
    assert head.pairs == TINY.prompts * TINY.reps and head.ratio_min <= head.ratio_median <= head.ratio_max
    assert rows["plain"].ratio_median is None and rows["plain (control)"].drafted == 0
    text = "\n".join(families.markdown([result]))
    assert f"### {name}" in text and NOT_REAL in text and "| draft-head |" in text and "distilled 3 steps" in text


def test_the_cli_option_adds_the_section_to_markdown_and_json(tmp_path, monkeypatch, cli_state):
    """The glm-dsa family end to end through ``tsspec bench --families`` (at the tiny size)."""
    _installed("glm-dsa")
    from tsspec.cli.app import main

    monkeypatch.setattr(families, "FULL", TINY)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "q1", "class": "qa", "prompt": "a b a b a b", "max_tokens": 6}) + "\n")
    out_md, out_json = tmp_path / "B.md", tmp_path / "b.json"
    try:
        main(["bench", "--model", "toy", "--prompts", str(prompts), "--reps", "1", "--spec-type", "ngram",
              "--families", "glm-dsa", "--markdown", str(out_md), "--json", str(out_json)])
    except SystemExit as exc:
        assert not exc.code
    assert "## Model families" in out_md.read_text() and "### glm-dsa" in out_md.read_text()
    (fam,) = json.loads(out_json.read_text())["families"]
    assert fam["family"] == "glm-dsa" and fam["status"] == "measured", fam["reason"]
    rows = {r["config"]: r for r in fam["rows"]}
    assert list(rows) == list(CONFIGS) and all(r["equal_to_plain"] for r in rows.values())
    assert rows[DRAFT_HEAD]["speculator"] == DRAFT_HEAD and rows[DRAFT_HEAD]["drafted"] > 0


def test_an_unknown_family_is_a_usage_error(cli_state, capsys):
    from tsspec.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "--model", "toy", "--families", "nope"])
    assert exc.value.code == 2
    assert "--families nope" in capsys.readouterr().err
