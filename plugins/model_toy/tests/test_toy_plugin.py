"""--model toy goes through the catalog like every model: registered, loaded by name, blocked
with its plugin."""

from __future__ import annotations

import pytest

import tsspec_model_toy
from tsspec.errors import ModelLoadError
from tsspec.plugins import PluginControls, PluginHost
from tsspec.runtime.catalog import build_catalog
from tsspec.runtime.loading import load_model
from tsspec.testing import ToyTarget


def _catalog(controls=None):
    host = PluginHost(controls)
    host.register(tsspec_model_toy, "toy")
    return build_catalog(host, discover=False)


def test_toy_and_seeded_toy_load_through_the_catalog():
    catalog = _catalog()
    assert catalog.models["toy"].file_less and catalog.models["toy"].plugin == "toy"
    target = load_model("toy:3", catalog=catalog)
    assert isinstance(target, ToyTarget)
    assert target.emb.equal(ToyTarget(seed=3).emb)
    assert load_model("toy", catalog=catalog).emb.equal(ToyTarget(seed=0).emb)
    with pytest.raises(ModelLoadError, match="seed must be an integer"):
        load_model("toy:x", catalog=catalog)


def test_without_the_plugin_toy_is_just_a_missing_file():
    catalog = _catalog(PluginControls.resolve(cli_plugins=""))
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model("toy", catalog=catalog)
