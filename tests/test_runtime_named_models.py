"""``--model NAME``: names plugins register, Ollama's local store, and ``tsspec models``."""

from __future__ import annotations

import json
import types

import pytest

from tsspec.errors import ModelLoadError
from tsspec.hookspecs import hookimpl
from tsspec.plugins import PluginHost
from tsspec.runtime.catalog import build_catalog
from tsspec.runtime.named_models import ollama_blob, resolve_model_path


def _catalog(resolved: str, installed: bool = True):
    mod = types.ModuleType("namedplugin")

    @hookimpl
    def tsspec_register_named_models(register):
        register("tiny-named", lambda: resolved, description="a tiny file", installed=installed)

    mod.tsspec_register_named_models = tsspec_register_named_models
    host = PluginHost()
    host.register(mod, "namedplugin")
    return build_catalog(host, discover=False)


def _ollama_store(tmp_path, name="smol", tag="latest", namespace="library", blob=b"GGUF...", layer=True):
    store = tmp_path / "ollama"
    digest = "sha256:" + "ab" * 32
    manifest = store / "manifests" / "registry.ollama.ai" / namespace / name / tag
    manifest.parent.mkdir(parents=True)
    kind = "application/vnd.ollama.image.model" if layer else "application/vnd.ollama.image.license"
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:00"},
                                               {"mediaType": kind, "digest": digest}]}))
    (store / "blobs").mkdir()
    if blob is not None:
        (store / "blobs" / digest.replace(":", "-")).write_bytes(blob)
    return store, str(store / "blobs" / digest.replace(":", "-"))


def test_a_registered_name_resolves_and_a_path_stays_a_path(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    catalog = _catalog("/models/tiny.gguf")
    entry = catalog.named_models["tiny-named"]
    assert entry.plugin == "namedplugin" and entry.installed and entry.description == "a tiny file"
    assert resolve_model_path("tiny-named", catalog) == "/models/tiny.gguf"
    existing = tmp_path / "tiny-named"
    existing.write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("tiny-named", catalog) == "tiny-named"  # a file of that name wins
    assert resolve_model_path("absent.gguf", catalog) == "absent.gguf"  # left for "no such file"


def test_ollama_names_resolve_to_their_model_blob(tmp_path, monkeypatch):
    store, blob = _ollama_store(tmp_path)
    assert ollama_blob("smol", [store]) == blob
    assert ollama_blob("smol:latest", [store]) == blob
    assert ollama_blob("smol:7b", [store]) is None and ollama_blob("other", [store]) is None
    assert ollama_blob("../../etc", [store]) is None
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    assert resolve_model_path("smol", _catalog("/x.gguf")) == blob


def test_ollama_store_problems_are_named(tmp_path):
    store, _ = _ollama_store(tmp_path, blob=None)
    with pytest.raises(ModelLoadError, match="blob .* is missing"):
        ollama_blob("smol", [store])
    other, _ = _ollama_store(tmp_path / "b", name="lic", layer=False)
    with pytest.raises(ModelLoadError, match="no model layer"):
        ollama_blob("lic", [other])


def test_models_command_lists_named_models_and_architectures(monkeypatch, capsys):
    from tsspec.cli import models_cmd
    from tsspec.cli.state import STATE

    monkeypatch.setattr(STATE, "catalog", _catalog("/x.gguf", installed=False))
    models_cmd.models(as_json=True)
    info = json.loads(capsys.readouterr().out)
    assert info["named"] == [{"name": "tiny-named", "installed": False, "default": False,
                              "description": "a tiny file", "plugin": "namedplugin"}]
    assert info["architectures"] == []
    models_cmd.models(as_json=False)
    assert "tiny-named       not installed           a tiny file (plugin namedplugin)" in capsys.readouterr().out



def _default_catalog(offers):
    """A catalog whose plugin offers ``offers``: (name, installed, default) triples."""
    mod = types.ModuleType("defaults")

    @hookimpl
    def tsspec_register_named_models(register):
        for name, installed, default in offers:
            register(name, lambda name=name: f"/models/{name}.gguf", installed=installed, default=default)

    mod.tsspec_register_named_models = tsspec_register_named_models
    host = PluginHost()
    host.register(mod, "defaults")
    return build_catalog(host, discover=False)


def test_the_default_model_is_the_first_installed_one_offered():
    from tsspec.runtime.named_models import default_model

    catalog = _default_catalog([("plain", True, False), ("absent", False, True), ("chosen", True, True)])
    assert default_model(catalog) == "chosen"


def test_no_default_model_is_a_one_line_error_naming_what_was_offered():
    from tsspec.runtime.named_models import default_model

    with pytest.raises(ModelLoadError, match="absent offered but not installed"):
        default_model(_default_catalog([("absent", False, True)]))
    with pytest.raises(ModelLoadError, match="no installed plugin offers a default model"):
        default_model(_default_catalog([]))


def test_load_model_without_a_path_loads_the_default(monkeypatch):
    from tsspec.runtime import loading

    seen = {}
    monkeypatch.setattr(loading, "file_architecture", lambda path, catalog=None: seen.setdefault("path", str(path)) and "nothing")
    with pytest.raises(ModelLoadError, match="served by no loaded plugin"):
        loading.load_model(catalog=_default_catalog([("chosen", True, True)]))
    assert seen["path"] == "/models/chosen.gguf"
