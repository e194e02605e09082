"""``tsspec convert``: dispatch on config.json to the converter a plugin registered, the alias,
and one-line errors (unknown type with the known list, bad --outtype, missing config)."""

from __future__ import annotations

import json
import types

import pytest
from typer.testing import CliRunner

from tsspec.cli.app import build_app
from tsspec.cli.state import STATE
from tsspec.hookspecs import hookimpl
from tsspec.plugins import PluginHost
from tsspec.runtime.catalog import build_catalog
from tsspec.runtime.converting import ConvertError, convert_checkpoint


def _plugin(calls):
    mod = types.ModuleType("fake_converter")

    def fake(src_dir, out_path, *, outtype):
        calls.append((src_dir.name, out_path.name, outtype))
        out_path.write_bytes(b"GGUF")

    @hookimpl
    def tsspec_register_converters(register):
        register(["toy_lm", "ToyDrafter"], fake, description="toy")

    mod.tsspec_register_converters = tsspec_register_converters
    return mod


@pytest.fixture
def catalog(monkeypatch):
    calls = []
    host = PluginHost()
    host.register(_plugin(calls), "toyconv")
    made = build_catalog(host, discover=False)
    monkeypatch.setattr(STATE, "catalog", made)
    return types.SimpleNamespace(converters=made.converters, calls=calls)


def _checkpoint(tmp_path, name, config):
    src = tmp_path / name
    src.mkdir()
    (src / "config.json").write_text(json.dumps(config))
    return src


def test_dispatches_on_model_type_and_architectures(catalog, tmp_path):
    lm = _checkpoint(tmp_path, "lm", {"model_type": "toy_lm"})
    key, entry = convert_checkpoint(catalog, lm, tmp_path / "a.gguf", outtype="q8_0")
    assert key == "toy_lm" and entry.plugin == "toyconv"
    # a drafter whose model_type is its base model's names itself in architectures
    drafter = _checkpoint(tmp_path, "dr", {"model_type": "qwen3", "architectures": ["ToyDrafter"]})
    assert convert_checkpoint(catalog, drafter, tmp_path / "b.gguf")[0] == "ToyDrafter"
    assert catalog.calls == [("lm", "a.gguf", "q8_0"), ("dr", "b.gguf", "f32")]


def test_unknown_types_and_bad_inputs_are_one_line(catalog, tmp_path):
    other = _checkpoint(tmp_path, "other", {"model_type": "mystery"})
    with pytest.raises(ConvertError, match="no converter for model_type 'mystery'; known types: ToyDrafter, toy_lm"):
        convert_checkpoint(catalog, other, tmp_path / "x.gguf")
    with pytest.raises(ConvertError, match="--outtype"):
        convert_checkpoint(catalog, other, tmp_path / "x.gguf", outtype="q4")
    with pytest.raises(ConvertError, match="no config.json"):
        convert_checkpoint(catalog, tmp_path, tmp_path / "x.gguf")
    with pytest.raises(ConvertError, match="not a checkpoint directory"):
        convert_checkpoint(catalog, tmp_path / "missing", tmp_path / "x.gguf")


def test_cli_command_and_alias(catalog, tmp_path):
    lm = _checkpoint(tmp_path, "lm", {"model_type": "toy_lm"})
    app = build_app()
    result = CliRunner().invoke(app, ["convert", str(lm), str(tmp_path / "a.gguf"), "--outtype", "f16"])
    assert result.exit_code == 0, result.output
    assert "toy_lm" in result.output and "toyconv" in result.output
    alias = CliRunner().invoke(app, ["convert", "hf-to-gguf", str(lm), str(tmp_path / "b.gguf")])
    assert alias.exit_code == 0, alias.output
    assert catalog.calls == [("lm", "a.gguf", "f16"), ("lm", "b.gguf", "f32")]


def test_main_prints_one_line_and_exit_2(tmp_path, capsys, monkeypatch, cli_state):
    from tsspec.cli.app import main

    bad = _checkpoint(tmp_path, "bad", {"model_type": "mystery"})
    monkeypatch.setenv("TSSPEC_PLUGINS", "")  # no plugins: no converter at all
    with pytest.raises(SystemExit) as exc:
        main(["convert", str(bad), str(tmp_path / "x.gguf")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "known types: none" in err


def test_convert_as_hands_a_checkpoint_to_another_plugins_converter(catalog, tmp_path):
    """A plugin's public way to another plugin's converter: by checkpoint type, settings passed
    on; a type no loaded plugin converts is one ConvertError line naming it."""
    from tsspec.runtime.converting import convert_as

    seen = []
    catalog.converters["Extra"] = types.SimpleNamespace(function=lambda s, o, *, outtype, **kw: seen.append((outtype, kw)))
    src = _checkpoint(tmp_path, "assistant", {"model_type": "somebody_elses"})
    convert_as("Extra", src, tmp_path / "x.gguf", outtype="f16", catalog=catalog, scale=0.5)
    assert seen == [("f16", {"scale": 0.5})]
    with pytest.raises(ConvertError, match="no loaded plugin converts 'DFlashDraftModel'"):
        convert_as("DFlashDraftModel", src, tmp_path / "y.gguf", catalog=catalog)
