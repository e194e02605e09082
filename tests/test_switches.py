"""The attribution switches: one parser; each plugin declares its own through the hook."""

from __future__ import annotations

import types

import pytest

from tsspec.hookspecs import hookimpl
from tsspec.plugins import PluginHost
from tsspec.runtime.catalog import build_catalog
from tsspec.switches import OFF_WORDS, describe, switch_on


@pytest.mark.parametrize("value", ["0", "false", "No", " off ", "OFF"])
def test_off_words_turn_a_switch_off(value):
    assert switch_on("TS_X_FAST", {"TS_X_FAST": value}) is False


@pytest.mark.parametrize("value", [None, "", "1", "yes", "anything"])
def test_anything_else_leaves_it_on(value):
    env = {} if value is None else {"TS_X_FAST": value}
    assert switch_on("TS_X_FAST", env) is True
    assert "0" in OFF_WORDS


def _switch_plugin(name: str, *switches):
    mod = types.ModuleType(name)

    @hookimpl
    def tsspec_register_switches(register):
        for switch, what in switches:
            register(switch, what)

    mod.tsspec_register_switches = tsspec_register_switches
    return mod


def test_the_catalog_collects_each_plugins_switches_and_help_lists_them():
    from typer.testing import CliRunner

    from tsspec.cli.app import build_app

    host = PluginHost()
    host.register(_switch_plugin("fast", ("TS_X_FAST", "the fast path is skipped")), "fast")
    host.register(_switch_plugin("again", ("TS_X_FAST", "taken"), ("TS_Y_FUSED", "unfused")), "again")
    catalog = build_catalog(host, discover=False)
    assert catalog.switch_descriptions() == {"TS_X_FAST": "the fast path is skipped", "TS_Y_FUSED": "unfused"}
    assert catalog.switches["TS_Y_FUSED"].plugin == "again"
    assert describe(catalog.switch_descriptions()).splitlines() == [
        "TS_X_FAST=0: the fast path is skipped", "TS_Y_FUSED=0: unfused"]
    out = CliRunner().invoke(build_app(catalog), ["--help"]).output
    assert "TS_X_FAST=0" in out and "TS_Y_FUSED=0" in out


def test_a_switch_without_a_description_fails_its_plugin():
    host = PluginHost()
    host.register(_switch_plugin("vague", ("TS_Z", "")), "vague")
    catalog = build_catalog(host, discover=False)
    assert catalog.switches == {} and host.records["vague"].status == "failed"
