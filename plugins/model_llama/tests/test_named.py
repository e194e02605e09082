"""Named models: registration, assembly into the cache once, and what a missing package says."""

from __future__ import annotations

import json

import pytest

from tsspec.errors import ModelLoadError
from tsspec_model_llama.named import NAMED_MODELS, NamedModel


def test_the_installed_plugins_list_gemma3_270m_and_the_families(capsys):
    from tsspec.cli.app import main

    with pytest.raises(SystemExit) as exit_info:
        main(["models", "--json"])
    assert exit_info.value.code in (0, None)
    info = json.loads(capsys.readouterr().out)
    assert {"name": "gemma3-270m", "installed": True, "default": False,
            "description": "Gemma 3 270M, Q4_K_M (gemma3)", "plugin": "llama"} in info["named"]
    embedded = next(m for m in info["named"] if m["name"] == "smollm2-135m")
    assert embedded["default"] and embedded["installed"] and embedded["plugin"] == "llama"
    archs = {a["architecture"] for a in info["architectures"] if a["plugin"] == "llama"}
    assert archs == {"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"}


def test_a_missing_package_is_named():
    model = NamedModel("nothing-here", "no_such_package_for_tsspec", "no-such-package", "x.gguf", "absent")
    assert not model.installed()
    with pytest.raises(ModelLoadError, match="needs the package no-such-package"):
        model.resolve()


def test_gemma3_270m_assembles_once(tmp_path):
    model = NAMED_MODELS["gemma3-270m"]
    path = model.resolve(tmp_path)
    assert path == str(tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf")
    stamp = (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").stat().st_mtime_ns
    assert model.resolve(tmp_path) == path
    assert (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["gemma-3-270m-q4_k_m.gguf"]


def test_load_model_without_a_path_loads_the_embedded_model():
    import tsspec
    from tsspec_gguf.embedded import embedded_model_path

    target = tsspec.load_model()
    assert target.path == str(embedded_model_path()) and target.config.architecture == "llama"
