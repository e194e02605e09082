"""The tsspec.toml config: lookup order and strict validation naming the key."""

from pathlib import Path

import pytest

from tsspec.config import find_config, load_config, validate
from tsspec.errors import ConfigError


def test_lookup_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert find_config(None, env) is None
    user = tmp_path / "xdg" / "tsspec" / "tsspec.toml"
    user.parent.mkdir(parents=True)
    user.write_text("[spec]\ndraft = 3\n")
    assert find_config(None, env) == user
    (tmp_path / "tsspec.toml").write_text("")
    assert find_config(None, env) == Path("tsspec.toml")  # ./tsspec.toml beats the user config
    named = tmp_path / "other.toml"
    named.write_text("")
    assert find_config(None, {**env, "TSSPEC_CONFIG": str(named)}) == named
    assert find_config(str(user), {**env, "TSSPEC_CONFIG": str(named)}) == user
    with pytest.raises(ConfigError, match="does not exist"):
        find_config(str(tmp_path / "missing.toml"), env)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"spec": {"drafts": 3}}, "unknown key spec.drafts"),
        ({"specs": {}}, r"unknown section \[specs\]"),
        ({"spec": {"draft": "8"}}, "spec.draft must be int"),
        ({"spec": {"draft": True}}, "spec.draft must be int"),
        ({"plugins": {"enabled": "ngram"}}, "plugins.enabled must be list"),
        ({"plugins": {"enabled": [1]}}, "list of strings"),
    ],
)
def test_validation_names_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        validate(data)


def test_load_valid_and_invalid_files(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[plugins]\nenabled = ["ngram"]\n[spec]\ntype = "ngram"\ndraft = 4\npmin = 0.5\n')
    assert load_config(good) == {"plugins": {"enabled": ["ngram"]}, "spec": {"type": "ngram", "draft": 4, "pmin": 0.5}}
    bad = tmp_path / "bad.toml"
    bad.write_text("[spec\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_plugin_tables_are_passed_through_and_checked_by_their_plugin():
    from tsspec.config import plugin_section

    data = validate({"plugin": {"serve": {"draft_memory": "pool.bin"}}})
    assert data["plugin"] == {"serve": {"draft_memory": "pool.bin"}}
    schema = {"draft_memory": (str,), "draft_memory_entries": (int,)}
    assert plugin_section(data, "serve", schema) == {"draft_memory": "pool.bin"}
    assert plugin_section(data, "other", schema) == {}
    with pytest.raises(ConfigError, match=r"unknown key plugin\.serve\.typo"):
        plugin_section(validate({"plugin": {"serve": {"typo": 1}}}), "serve", schema)
    with pytest.raises(ConfigError, match=r"plugin\.serve\.draft_memory_entries must be int"):
        plugin_section(validate({"plugin": {"serve": {"draft_memory_entries": "x"}}}), "serve", schema)
    with pytest.raises(ConfigError, match=r"\[plugin\.serve\] must be a table"):
        validate({"plugin": {"serve": 3}})
