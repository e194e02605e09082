"""Bundled drafters: registered through the drafters hook, matched by the target FILE's
identity (architecture, tensor-shape digest, sha256), never its name; trainers through theirs."""

from __future__ import annotations

import shutil
import types

import numpy as np
import pytest

from tsspec.hookspecs import hookimpl
from tsspec_gguf.gguf_writer_util import write_gguf
from tsspec_gguf.identity import identify, shape_digest
from tsspec.plugins import PluginHost
from tsspec.runtime.bundled import BUNDLED_ENV, pick
from tsspec.runtime.catalog import build_catalog


def _model(path, seed=0, hidden=8):
    rng = np.random.default_rng(seed)
    return write_gguf(path, "llama", {"llama.block_count": 1},
                      {"token_embd.weight": rng.normal(size=(16, hidden)).astype(np.float32)})


def _plugin(files):
    mod = types.ModuleType("bundling")

    @hookimpl
    def tsspec_register_drafters(register):
        register([], None, files=files)

    @hookimpl
    def tsspec_register_trainers(register):
        register("toykind", lambda request, target, log: {}, description="a test trainer")

    mod.tsspec_register_drafters = tsspec_register_drafters
    mod.tsspec_register_trainers = tsspec_register_trainers
    return mod


def _catalog(files, toolkit=True):
    import tsspec_gguf

    host = PluginHost()
    host.register(_plugin(files), "bundling")
    if toolkit:  # the file toolkit makes each record's target identity
        host.register(tsspec_gguf, "gguf")
    return build_catalog(host, discover=False)


def test_identity_is_by_content_not_name(tmp_path):
    a = _model(tmp_path / "a.gguf")
    renamed = tmp_path / "renamed.gguf"
    shutil.copy(a, renamed)
    same_shapes = _model(tmp_path / "b.gguf", seed=1)
    other_shapes = _model(tmp_path / "c.gguf", hidden=4)
    ident = identify(a)
    assert ident.matches(renamed)
    assert shape_digest(same_shapes) == shape_digest(a) and not ident.matches(same_shapes)
    assert not ident.matches(other_shapes)
    assert not ident.matches(tmp_path / "missing.gguf")


def test_registered_files_are_picked_for_their_target_only(tmp_path, monkeypatch):
    a = _model(tmp_path / "a.gguf")
    drafter = tmp_path / "drafter.gguf"
    drafter.write_bytes(b"x")  # only its presence matters to the registry
    files = [{"path": str(drafter), "algorithm": "draft-head", "target": identify(a).to_json()}]
    assert _catalog(files, toolkit=False).bundled_drafters == []  # nothing could match them
    catalog = _catalog(files)
    [record] = catalog.bundled_drafters
    assert record.plugin == "bundling" and record.algorithm == "draft-head"
    assert pick(catalog.bundled_drafters, a, "auto") == record
    assert pick(catalog.bundled_drafters, a, "draft-head") == record
    assert pick(catalog.bundled_drafters, a, "ngram") is None
    assert pick(catalog.bundled_drafters, _model(tmp_path / "b.gguf", seed=1), "auto") is None
    not_auto = _catalog([{**files[0], "auto": False}]).bundled_drafters
    assert pick(not_auto, a, "auto") is None and pick(not_auto, a, "draft-head") == not_auto[0]
    monkeypatch.setenv(BUNDLED_ENV, "0")
    assert pick(catalog.bundled_drafters, a, "auto") is None


def test_malformed_files_fail_the_plugin_hook(tmp_path):
    host = PluginHost()
    host.register(_plugin([{"path": "x.gguf", "target": {"architecture": "llama"}}]), "bundling")
    catalog = build_catalog(host, discover=False)
    assert catalog.bundled_drafters == [] and "shape_digest" in host.records["bundling"].reason


def test_trainers_are_registered_by_kind():
    catalog = _catalog([])
    assert catalog.trainers["toykind"].plugin == "bundling"
    assert catalog.trainers["toykind"].description == "a test trainer"


