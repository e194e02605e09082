"""SpeculationOptions: precedence, TS_SPEC_* / TS_MTP_* aliasing both ways, ranges, warnings."""

import pytest

from tsspec.errors import OptionsError
from tsspec.runtime.options import SpeculationOptions


def test_defaults():
    o = SpeculationOptions.resolve(env={})
    assert o.enabled and o.spec_type == "auto" and o.window() == 8 and o.adaptive
    assert o.window(preferred=3) == 3  # narrowed by the target


@pytest.mark.parametrize("prefix", ["TS_SPEC_", "TS_MTP_"])
def test_env_read_from_either_prefix(prefix):
    o = SpeculationOptions.resolve(env={prefix + "DRAFT": "5", prefix + "PMIN": "0.5", prefix + "SPEC": "0"})
    assert o.draft == 5 and o.pmin == 0.5 and not o.enabled


def test_published_under_both_prefixes():
    env: dict[str, str] = {}
    SpeculationOptions.resolve(cli={"draft": 3, "pmin": 0.2}, env={}).publish(env)
    assert env["TS_SPEC_DRAFT"] == env["TS_MTP_DRAFT"] == "3"
    assert env["TS_SPEC_PMIN"] == env["TS_MTP_PMIN"] == "0.2"
    assert env["TS_SPEC_SPEC"] == env["TS_MTP_SPEC"] == "1"
    # and what is published reads back to the same options
    again = SpeculationOptions.resolve(env=env)
    assert (again.draft, again.pmin, again.enabled) == (3, 0.2, True)


def test_precedence_cli_env_config():
    config = {"draft": 2, "type": "ngram"}
    o = SpeculationOptions.resolve(cli={}, env={"TS_SPEC_DRAFT": "4"}, config=config)
    assert o.draft == 4 and o.spec_type == "ngram"
    o = SpeculationOptions.resolve(cli={"draft": 6}, env={"TS_SPEC_DRAFT": "4"}, config=config)
    assert o.draft == 6
    o = SpeculationOptions.resolve(env={"TS_MTP_DRAFT": "4", "TS_SPEC_DRAFT": "7"})
    assert o.draft == 7  # the modern spelling wins


@pytest.mark.parametrize(
    "cli, message",
    [
        ({"draft": 0}, "--spec-draft must be between 1 and 64"),
        ({"draft": 65}, "--spec-draft must be between 1 and 64"),
        ({"pmin": 1.5}, "--spec-pmin must be between 0 and 1"),
        ({"pmin": -0.1}, "--spec-pmin"),
        ({"draft_model": "a.gguf", "spec_draft_model": "b.gguf"}, "conflict"),
    ],
)
def test_out_of_range(cli, message):
    with pytest.raises(OptionsError, match=message):
        SpeculationOptions.resolve(cli=cli, env={})


@pytest.mark.parametrize("env", [{"TS_SPEC_DRAFT": "x"}, {"TS_MTP_PMIN": "high"}, {"TS_SPEC_ADAPTIVE": "maybe"}])
def test_bad_env_values(env):
    with pytest.raises(OptionsError, match=list(env)[0]):
        SpeculationOptions.resolve(env=env)


def test_tuning_flags_without_spec_warn():
    o = SpeculationOptions.resolve(cli={"enabled": False, "draft": 4, "spec_type": "ngram"}, env={})
    warnings = o.ignored_tuning_warnings()
    assert len(warnings) == 2 and all("no effect" in w for w in warnings)
    assert SpeculationOptions.resolve(cli={"draft": 4}, env={}).ignored_tuning_warnings() == []


def test_adaptive_switch():
    assert not SpeculationOptions.resolve(env={"TS_SPEC_ADAPTIVE": "0"}).adaptive
    assert SpeculationOptions.resolve(cli={"adaptive": True}, env={"TS_SPEC_ADAPTIVE": "0"}).adaptive
