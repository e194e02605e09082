"""The plugin as the core sees it: entry point, hook, registry, decline reasons."""

from __future__ import annotations

import importlib.metadata as metadata

import tsspec_ngram
from tsspec.plugins import PluginHost
from tsspec.runtime.catalog import build_catalog
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.registry import Decline, SpeculatorRegistry
from tsspec.testing import ToyTarget
from tsspec_ngram import NGramSpeculator


def test_entry_point_names_the_module():
    eps = [ep for ep in metadata.entry_points(group="tsspec") if ep.name == "ngram"]
    assert len(eps) == 1 and eps[0].value == "tsspec_ngram"
    assert eps[0].dist.metadata["Name"] == "tsspec-ngram"


def test_hook_registers_a_weight_free_algorithm():
    registry = SpeculatorRegistry()
    tsspec_ngram.tsspec_register_speculators(registry.register)
    entry = registry.get("ngram")
    assert entry is not None and entry.requires_draft_head is False and entry.description
    made = registry.create(ToyTarget(), SpeculationOptions(spec_type="ngram"))
    assert isinstance(made, NGramSpeculator)
    # auto picks ngram on a target that carries no drafter
    assert isinstance(registry.create(ToyTarget(), SpeculationOptions()), NGramSpeculator)


def test_registry_declines_where_the_trunk_is_unprofitable():
    registry = SpeculatorRegistry()
    tsspec_ngram.tsspec_register_speculators(registry.register)
    target = ToyTarget()
    target.speculation_profitable = False
    made = registry.create(target, SpeculationOptions(spec_type="ngram"))
    assert isinstance(made, Decline) and made.code == "unprofitable"


def test_loaded_through_the_plugin_host():
    host = PluginHost()
    host.register(tsspec_ngram, "ngram", package="tsspec-ngram")
    catalog = build_catalog(host)
    assert "ngram" in catalog.speculators.names()
    assert host.plugin_info("ngram").hooks == ["tsspec_register_speculators"]
