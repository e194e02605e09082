"""The plugin host: registration records, operator controls, failures recorded not fatal.
Each test builds a fresh PluginHost (no global state leaks between tests)."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
import textwrap
import types

import pytest

from tsspec.hookspecs import hookimpl
from tsspec.plugins import BLOCKED, DISABLED, FAILED, LOADED, PluginControls, PluginHost
from tsspec.runtime.catalog import build_catalog


def make_plugin(name="good", raise_in_hook=False):
    mod = types.ModuleType(f"fake_{name}")

    @hookimpl
    def tsspec_register_speculators(register):
        if raise_in_hook:
            raise RuntimeError(f"{name} hook exploded")
        register(name, lambda t, o: None, requires_draft_head=False, description=f"{name} algo")

    mod.tsspec_register_speculators = tsspec_register_speculators
    return mod


def test_in_process_plugin_registers_and_is_recorded():
    host = PluginHost()
    record = host.register(make_plugin("alpha"), "alpha", package="tsspec-alpha", version="1.2")
    assert record.status == LOADED and record.hooks == ["tsspec_register_speculators"]
    catalog = build_catalog(host, discover=False)
    entry = catalog.speculators.get("alpha")
    assert (entry.plugin, entry.package, entry.version) == ("alpha", "tsspec-alpha", "1.2")


def test_hook_raising_is_recorded_and_others_still_load():
    host = PluginHost(PluginControls())
    host.register(make_plugin("bad", raise_in_hook=True), "bad")
    host.register(make_plugin("good"), "good")
    catalog = build_catalog(host, discover=False)
    assert catalog.speculators.names() == ["good"]
    bad = host.records["bad"]
    assert bad.status == FAILED and "bad hook exploded" in bad.reason


def test_allow_list_and_deny_list():
    host = PluginHost(PluginControls.resolve(cli_plugins="a,b", cli_disable=["b"]))
    for n in ("a", "b", "c"):
        host.register(make_plugin(n), n)
    status = {n: host.records[n].status for n in "abc"}
    assert status == {"a": LOADED, "b": DISABLED, "c": BLOCKED}
    assert "--plugins" in host.records["c"].reason
    assert build_catalog(host, discover=False).speculators.names() == ["a"]


def test_empty_allow_list_means_none():
    controls = PluginControls.resolve(env={"TSSPEC_PLUGINS": ""})
    assert controls.enabled == frozenset()
    host = PluginHost(controls)
    host.register(make_plugin("a"), "a")
    assert host.records["a"].status == BLOCKED


def test_control_precedence():
    config = {"enabled": ["x"], "disabled": ["y"]}
    env = {"TSSPEC_PLUGINS": "y,z", "TSSPEC_DISABLE_PLUGINS": "z"}
    c = PluginControls.resolve(env=env, config=config)
    assert c.enabled == {"y", "z"} and c.disabled == {"y", "z"}  # env allow-list beats config
    c = PluginControls.resolve(cli_plugins="x", env=env, config=config)
    assert c.enabled == {"x"}
    c = PluginControls.resolve(config=config)
    assert c.enabled == {"x"} and c.verdict("y")[0] == DISABLED


class FakeEntryPoint:
    def __init__(self, name, loader):
        self.name, self._loader, self.dist = name, loader, None

    def load(self):
        return self._loader()


def test_import_failure_is_recorded_and_loading_is_idempotent():
    def boom():
        raise ImportError("No module named 'missing_dep'")

    host = PluginHost()
    eps = [FakeEntryPoint("broken", boom), FakeEntryPoint("fine", lambda: make_plugin("fine"))]
    host.load_entrypoints(entry_points=eps)
    host.load_entrypoints(entry_points=eps)  # a second call changes nothing
    assert host.records["broken"].status == FAILED
    assert "import failed: ImportError: No module named 'missing_dep'" == host.records["broken"].reason
    assert host.records["fine"].status == LOADED
    assert len(host.pm.get_plugins()) == 1


def test_bad_hookimpl_signature_fails_registration():
    mod = types.ModuleType("wrong")

    @hookimpl
    def tsspec_register_speculators(register, unknown_argument):
        pass

    mod.tsspec_register_speculators = tsspec_register_speculators
    host = PluginHost()
    assert host.register(mod, "wrong").status == FAILED


def test_builtin_plugins_come_through_entry_points():
    names = {ep.name for ep in md.entry_points(group="tsspec")}
    assert {"ngram", "draft-head"} <= names
    host = PluginHost()
    host.load_entrypoints()
    assert all(r.package and r.version for r in host.list_records() if r.status == LOADED)


@pytest.mark.slow
def test_real_entry_point_install(tmp_path):
    """A throwaway distribution installed into the venv shows up in `tsspec plugins --json`."""
    pkg = tmp_path / "tsspec-throwaway"
    (pkg / "src" / "tsspec_throwaway").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "tsspec-throwaway"
        version = "9.8.7"
        [project.entry-points.tsspec]
        throwaway = "tsspec_throwaway"
    '''))
    (pkg / "src" / "tsspec_throwaway" / "__init__.py").write_text(textwrap.dedent('''
        from tsspec.hookspecs import hookimpl

        @hookimpl
        def tsspec_register_speculators(register):
            register("throwaway", lambda target, options: None, requires_draft_head=False)
    '''))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", str(pkg)], check=True)
    try:
        out = subprocess.run([sys.executable, "-c", "from tsspec.cli.app import main; main()", "plugins", "--json"],
                             check=True, capture_output=True, text=True).stdout
        rows = {r["name"]: r for r in json.loads(out)}
        assert rows["throwaway"]["version"] == "9.8.7" and rows["throwaway"]["status"] == LOADED
        assert rows["throwaway"]["package"] == "tsspec-throwaway"
        out = subprocess.run([sys.executable, "-c", "from tsspec.cli.app import main; main()",
                              "--disable-plugin", "throwaway", "plugins", "--json"],
                             check=True, capture_output=True, text=True).stdout
        assert {r["name"]: r for r in json.loads(out)}["throwaway"]["status"] == DISABLED
    finally:
        subprocess.run([*pip, "uninstall", "-y", "tsspec-throwaway"], check=True)


def test_hooks_are_called_through_pluggy_so_wrappers_run():
    """A plugin's hook wrapper runs around every other plugin's registration call."""
    seen = []

    class Tracer:
        @hookimpl(wrapper=True)
        def tsspec_register_speculators(self, register):
            seen.append("before")
            result = yield
            seen.append("after")
            return result

    host = PluginHost()
    host.register(make_plugin("alpha"), "alpha")
    host.register(make_plugin("beta"), "beta")
    host.register(Tracer(), "tracer")
    catalog = build_catalog(host, discover=False)
    assert catalog.speculators.names() == ["alpha", "beta"]
    assert seen == ["before", "after"] * 2  # once around each plugin's own call


def test_bad_registration_arguments_fail_that_plugin_only():
    mod = types.ModuleType("fake_bad_args")

    @hookimpl
    def tsspec_register_speculators(register):
        register("fine", lambda t, o: None, requires_draft_head=False)
        register("odd", lambda t, o: None, requires_draft_head=False, default_pmin=7)

    mod.tsspec_register_speculators = tsspec_register_speculators
    host = PluginHost()
    host.register(mod, "badargs")
    host.register(make_plugin("good"), "good")
    catalog = build_catalog(host, discover=False)
    assert catalog.speculators.names() == ["good"]  # "fine" is dropped with its plugin
    assert host.records["badargs"].status == FAILED and "default_pmin" in host.records["badargs"].reason


def test_the_hook_list_is_every_hookspec():
    """HOOK_NAMES is derived from hookspecs.py: every declared hook (trainers included) is
    recorded against a plugin that implements it."""
    import inspect

    from tsspec import hookspecs
    from tsspec.plugins import HOOK_NAMES

    declared = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("tsspec_")]
    assert sorted(HOOK_NAMES) == sorted(declared) and "tsspec_register_trainers" in HOOK_NAMES
    mod = types.ModuleType("fake_trainer")

    @hookimpl
    def tsspec_register_trainers(register):
        register("kind", lambda request, target, log: {})

    mod.tsspec_register_trainers = tsspec_register_trainers
    assert PluginHost().register(mod, "trainer").hooks == ["tsspec_register_trainers"]


@pytest.mark.parametrize("required, loads", [("1.0", True), ("1", True), ("1.0.0", True), ("1.1", False),
                                              ("2.0", False), ("0.9", False), ("soon", False)])
def test_a_plugin_requiring_a_newer_contract_is_a_named_failure(required, loads):
    import tsspec

    assert tsspec.CONTRACT_VERSION == tsspec.__version__ == "1.0.0"
    mod = make_plugin("versioned")
    mod.TSSPEC_CONTRACT = required
    host = PluginHost()
    record = host.register(mod, "versioned")
    catalog = build_catalog(host, discover=False)
    assert (record.status == LOADED) is loads and (catalog.speculators.get("versioned") is not None) is loads
    if not loads:
        assert record.status == FAILED and required in record.reason
