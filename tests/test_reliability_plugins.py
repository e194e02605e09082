"""Reliability of plugin loading: a plugin that fails at import, in a registration hook or in its
speculator factory is recorded (status ``failed`` and a reason), logged with its name, skipped
whole, and never takes the process down; generation still completes with the plain output.

In-process cases use a fresh ``PluginHost`` per test with fake ``importlib.metadata.EntryPoint``
objects pointing at modules written to a temporary directory. The CLI cases install real entry
points (a ``*.dist-info`` directory on ``sys.path``), exactly as a pip-installed plugin would be
found, and run ``tsspec`` both in-process and as a subprocess.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import logging
import os
import subprocess
import sys
import textwrap
import types
import uuid

import pytest

from tsspec.hookspecs import hookimpl
from tsspec.plugins import BLOCKED, FAILED, LOADED, PluginControls, PluginHost
from tsspec.protocols import SpeculatorDeclined
from tsspec.runtime import execution
from tsspec.runtime.catalog import build_catalog
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.registry import CANNOT_SERVE, PLUGIN_ERROR
from tsspec.testing import RandomSpeculator, ToyTarget, plain_tokens

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]
MAX_TOKENS = 24
TARGET_SEED = 2
GOOD_ALGORITHM = "good-random"  # what the well-behaved plugin registers


def _target() -> ToyTarget:
    return ToyTarget(seed=TARGET_SEED)


@pytest.fixture(scope="module")
def plain() -> list[int]:
    return plain_tokens(_target(), PROMPT, MAX_TOKENS)



@pytest.fixture(autouse=True)
def _fresh_fault_log(monkeypatch):
    monkeypatch.setattr(execution, "_logged_faults", set())


def _good_plugin() -> types.ModuleType:
    """A well-behaved plugin, registered next to each broken one: it must keep working."""
    module = types.ModuleType("good_plugin")

    @hookimpl
    def tsspec_register_speculators(register):
        register(GOOD_ALGORITHM, lambda target, options: RandomSpeculator(target.config.vocab_size, seed=1),
                 requires_draft_head=False, description="random drafts")

    module.tsspec_register_speculators = tsspec_register_speculators
    return module


def _assert_good_plugin_serves(catalog, plain):
    result = generate(_target(), PROMPT, SpeculationOptions(spec_type=GOOD_ALGORITHM, adaptive=False),
                      max_tokens=MAX_TOKENS, registry=catalog.speculators)
    assert result.speculator == "random" and result.decline is None
    assert result.tokens == plain


# -- modules on disk, entry points in memory ---------------------------------------------------


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A directory on sys.path; ``write(source)`` creates a uniquely named module in it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created: list[str] = []

    def write(source: str, stem: str = "plugin") -> str:
        name = f"tsspec_test_{stem}_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        created.append(name)
        return name

    write.path = tmp_path
    yield write
    for name in created:
        sys.modules.pop(name, None)


def _entry_point(name: str, value: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name=name, value=value, group="tsspec")


GOOD_SOURCE = """
from tsspec.hookspecs import hookimpl
from tsspec.testing import RandomSpeculator

@hookimpl
def tsspec_register_speculators(register):
    register("{algorithm}", lambda t, o: RandomSpeculator(t.config.vocab_size, seed=1),
             requires_draft_head=False)
"""

IMPORT_FAULTS = {  # case -> (module source or None for "no module", entry-point suffix, reason phrase)
    "ImportError at import": ("raise ImportError('needs libfoo.so.3')", "", "import failed: ImportError: needs libfoo.so.3"),
    "RuntimeError at import": ("raise RuntimeError('boom at import time')", "", "import failed: RuntimeError: boom at import time"),
    "syntax error": ("def broken(:\n    pass\n", "", "import failed: SyntaxError"),
    "sys.exit at import": ("import sys\nsys.exit(3)\n", "", "import failed: SystemExit: 3"),
    "module does not exist": (None, "", "import failed: ModuleNotFoundError"),
    "attribute does not exist": ("x = 1\n", ":missing_object", "import failed: AttributeError"),
    "hookimpl with an unknown argument": (
        "from tsspec.hookspecs import hookimpl\n\n@hookimpl\ndef tsspec_register_speculators(register, surprise):\n    pass\n",
        "", "registration failed: PluginValidationError"),
}


@pytest.mark.parametrize("case", sorted(IMPORT_FAULTS))
def test_plugin_failing_at_import_is_recorded_and_skipped(case, plugin_dir, plain, caplog):
    source, suffix, phrase = IMPORT_FAULTS[case]
    module = plugin_dir(source) if source is not None else f"tsspec_test_absent_{uuid.uuid4().hex[:8]}"
    good = plugin_dir(GOOD_SOURCE.format(algorithm=GOOD_ALGORITHM), "good")
    host = PluginHost()
    with caplog.at_level(logging.WARNING, logger="tsspec.plugins"):
        host.load_entrypoints(entry_points=[_entry_point("broken", module + suffix), _entry_point("good", good)])
        catalog = build_catalog(host, discover=False)
    record = host.records["broken"]
    assert record.status == FAILED and phrase in record.reason, record
    assert "\n" not in record.reason
    assert host.records["good"].status == LOADED
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("broken" in m and phrase.split(":")[0] in m for m in warnings), warnings
    assert catalog.speculators.names() == [GOOD_ALGORITHM]
    _assert_good_plugin_serves(catalog, plain)


def test_keyboard_interrupt_at_import_is_not_swallowed(plugin_dir):
    """The operator's Ctrl-C must still stop the process, even inside a plugin's import."""
    module = plugin_dir("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        PluginHost().load_entrypoints(entry_points=[_entry_point("ctrl-c", module)])


# -- registration hooks ------------------------------------------------------------------------


def _hook_plugin(**hooks) -> types.ModuleType:
    module = types.ModuleType("broken_plugin")
    for hook_name, function in hooks.items():
        setattr(module, hook_name, hookimpl(function))
    return module


def _speculators_hook(body):
    def tsspec_register_speculators(register):
        body(register)

    return tsspec_register_speculators


def _registers_then_raises(register):
    register("half-registered", lambda t, o: RandomSpeculator(t.config.vocab_size), requires_draft_head=False)
    raise RuntimeError("hook exploded after registering")


def _raise(exc):
    raise exc


HOOK_FAULTS = {  # case -> (hooks, reason phrase)
    "hook raises": (
        dict(tsspec_register_speculators=_speculators_hook(lambda r: _raise(RuntimeError("hook exploded")))),
        "tsspec_register_speculators raised: RuntimeError: hook exploded"),
    "hook registers, then raises": (
        dict(tsspec_register_speculators=_speculators_hook(_registers_then_raises)),
        "RuntimeError: hook exploded after registering"),
    "factory not callable": (
        dict(tsspec_register_speculators=_speculators_hook(
            lambda r: r("not-callable", "a string", requires_draft_head=False))),
        "TypeError"),
    "reserved name auto": (
        dict(tsspec_register_speculators=_speculators_hook(
            lambda r: r("auto", lambda t, o: None, requires_draft_head=False))),
        "ValueError"),
    "name not a string": (
        dict(tsspec_register_speculators=_speculators_hook(
            lambda r: r(42, lambda t, o: None, requires_draft_head=False))),
        "ValueError"),
    "missing keyword": (
        dict(tsspec_register_speculators=_speculators_hook(lambda r: r("no-kw", lambda t, o: None))),
        "TypeError"),
    "hook calls sys.exit": (
        dict(tsspec_register_speculators=_speculators_hook(lambda r: sys.exit(4))),
        "SystemExit: 4"),
    "model loader not callable": (
        dict(tsspec_register_models=lambda register: register(["llama"], None)),
        "tsspec_register_models raised: TypeError"),
    "later hook raises": (
        dict(
            tsspec_register_speculators=_speculators_hook(
                lambda r: r("registered-before-models", lambda t, o: RandomSpeculator(t.config.vocab_size),
                            requires_draft_head=False)),
            tsspec_register_models=lambda register: _raise(ValueError("models hook exploded")),
        ),
        "tsspec_register_models raised: ValueError: models hook exploded"),
}


@pytest.mark.parametrize("case", sorted(HOOK_FAULTS))
def test_plugin_failing_in_a_hook_is_skipped_whole(case, plain, caplog):
    hooks, phrase = HOOK_FAULTS[case]
    host = PluginHost()
    host.register(_hook_plugin(**hooks), "broken")
    host.register(_good_plugin(), "good")
    with caplog.at_level(logging.WARNING, logger="tsspec.plugins"):
        catalog = build_catalog(host, discover=False)
    record = host.records["broken"]
    assert record.status == FAILED and phrase in record.reason, record
    assert host.records["good"].status == LOADED
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("broken" in m and phrase in m for m in warnings) == 1, warnings
    # a failed plugin contributes nothing, even what it registered before failing
    assert catalog.speculators.names() == [GOOD_ALGORITHM]
    assert all(entry.plugin != "broken" for entry in catalog.models.values())
    _assert_good_plugin_serves(catalog, plain)


def test_a_failed_plugin_does_not_take_names_from_a_good_one(plain):
    """The failed plugin registered first (by name order); the good one's registration of the
    same algorithm name must be the one kept."""
    host = PluginHost()

    def steal(register):
        register(GOOD_ALGORITHM, lambda t, o: None, requires_draft_head=False)
        raise RuntimeError("then fails")

    host.register(_hook_plugin(tsspec_register_speculators=_speculators_hook(steal)), "aaa-broken")
    host.register(_good_plugin(), "zzz-good")
    catalog = build_catalog(host, discover=False)
    assert catalog.speculators.get(GOOD_ALGORITHM).plugin == "zzz-good"
    _assert_good_plugin_serves(catalog, plain)


# -- speculator factories ----------------------------------------------------------------------


class _NotQuiteASpeculator:
    name = "half"
    needs_hidden_state = False
    commit = "not a method"  # optional, but when present it must be one

    def propose(self, ctx):
        return []


def _declining(target, options):
    raise SpeculatorDeclined("needs a GPU it does not have")


FACTORY_FAULTS = {  # case -> (factory, decline code, phrase in the reason)
    "raises RuntimeError": (lambda t, o: _raise(RuntimeError("factory exploded")), PLUGIN_ERROR, "factory exploded"),
    "raises KeyError": (lambda t, o: {}["missing"], PLUGIN_ERROR, "KeyError"),
    "returns None": (lambda t, o: None, CANNOT_SERVE, "declined"),
    "declines with a reason": (_declining, CANNOT_SERVE, "needs a GPU it does not have"),
    "returns a string": (lambda t, o: "a speculator, honest", PLUGIN_ERROR, "not a speculator"),
    "returns an int": (lambda t, o: 42, PLUGIN_ERROR, "not a speculator"),
    "returns a dict": (lambda t, o: {"propose": None}, PLUGIN_ERROR, "not a speculator"),
    "returns an object whose commit is no method": (lambda t, o: _NotQuiteASpeculator(), PLUGIN_ERROR,
                                                    "commit must be a method"),
}


@pytest.mark.parametrize("case", sorted(FACTORY_FAULTS))
def test_factory_faults_become_declines_and_plain_output(case, plain, caplog):
    factory, code, phrase = FACTORY_FAULTS[case]
    host = PluginHost()
    module = _hook_plugin(tsspec_register_speculators=_speculators_hook(
        lambda r: r("fragile", factory, requires_draft_head=False)))
    host.register(module, "fragile-plugin")
    catalog = build_catalog(host, discover=False)
    with caplog.at_level(logging.WARNING):
        result = generate(_target(), PROMPT, SpeculationOptions(spec_type="fragile"), max_tokens=MAX_TOKENS,
                          registry=catalog.speculators)
    assert result.tokens == plain
    assert result.speculator is None and result.decline is not None
    assert result.decline.code == code and phrase in result.decline.reason, result.decline
    if code == PLUGIN_ERROR:  # the operator is told which plugin to blame
        assert "fragile-plugin" in result.decline.reason
        assert any("fragile-plugin" in r.getMessage() for r in caplog.records)


def test_factory_returning_a_class_instead_of_an_instance(plain, caplog):
    """Callable propose/commit, wrong binding: it passes the registry's check and then faults
    at every call, which the loop counts and parks."""
    from tsspec.testing import RandomSpeculator as NotAnInstance

    host = PluginHost()
    module = _hook_plugin(tsspec_register_speculators=_speculators_hook(
        lambda r: r("class-not-instance", lambda t, o: NotAnInstance, requires_draft_head=False)))
    host.register(module, "sloppy")
    catalog = build_catalog(host, discover=False)
    with caplog.at_level(logging.WARNING):
        result = generate(_target(), PROMPT, SpeculationOptions(spec_type="class-not-instance", adaptive=False),
                          max_tokens=MAX_TOKENS, registry=catalog.speculators)
    assert result.tokens == plain
    assert result.stats.faults >= execution.MAX_FAULTS and result.stats.speculator_parked


def test_runtime_fault_is_logged_once_with_the_plugin_name(plain, caplog):
    class Raising(RandomSpeculator):
        name = "flaky"

        def propose(self, ctx):
            raise RuntimeError("propose exploded")

    host = PluginHost()
    module = _hook_plugin(tsspec_register_speculators=_speculators_hook(
        lambda r: r("flaky-algo", lambda t, o: Raising(t.config.vocab_size), requires_draft_head=False)))
    host.register(module, "flaky-plugin")
    catalog = build_catalog(host, discover=False)
    with caplog.at_level(logging.WARNING, logger="tsspec.execution"):
        for _ in range(2):  # a second request: the first fault was already reported
            result = generate(_target(), PROMPT, SpeculationOptions(spec_type="flaky-algo", adaptive=False),
                              max_tokens=MAX_TOKENS, registry=catalog.speculators)
            assert result.tokens == plain
            assert result.stats.fault_kinds == {execution.PROPOSE_RAISED: execution.MAX_FAULTS}
            assert result.stats.speculator_parked
    first = [r.getMessage() for r in caplog.records if "output is unaffected" in r.getMessage()]
    assert len(first) == 1 and "flaky-plugin" in first[0] and "propose_raised" in first[0], first


# -- the CLI, with real entry points -----------------------------------------------------------

DIST_PLUGINS = {  # entry-point name -> module source
    "evil-import": "raise ImportError('cannot import name nothing from nowhere')\n",
    "evil-hook": textwrap.dedent("""
        from tsspec.hookspecs import hookimpl

        @hookimpl
        def tsspec_register_speculators(register):
            register("evil-half", lambda t, o: None, requires_draft_head=False)
            raise RuntimeError("evil hook")
    """),
    "evil-commands": textwrap.dedent("""
        from tsspec.hookspecs import hookimpl

        @hookimpl
        def tsspec_register_commands(app):
            raise RuntimeError("evil commands")
    """),
    "evil-factory": textwrap.dedent("""
        from tsspec.hookspecs import hookimpl

        def factory(target, options):
            raise RuntimeError("evil factory")

        @hookimpl
        def tsspec_register_speculators(register):
            register("evil-factory-algo", factory, requires_draft_head=False)
    """),
}
DIST_REASONS = {
    "evil-import": "import failed: ImportError: cannot import name nothing from nowhere",
    "evil-hook": "tsspec_register_speculators raised: RuntimeError: evil hook",
    "evil-commands": "tsspec_register_commands raised: RuntimeError: evil commands",
}


@pytest.fixture
def installed_evil(tmp_path, monkeypatch):
    """Evil plugins installed as distributions (dist-info + entry points) on sys.path."""
    suffix = uuid.uuid4().hex[:8]
    modules = []
    for ep_name, source in DIST_PLUGINS.items():
        module = f"tsspec_{ep_name.replace('-', '_')}_{suffix}"
        (tmp_path / f"{module}.py").write_text(source)
        dist = tmp_path / f"{module}-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {ep_name}\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(f"[tsspec]\n{ep_name} = {module}\n")
        modules.append(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for module in modules:
        sys.modules.pop(module, None)


@pytest.fixture
def cli(monkeypatch, tmp_path, cli_state):
    """tsspec's main() in-process; global state (default catalog, CLI state) restored after;
    no config file of the machine's user is read."""
    from tsspec.cli import app as cli_app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user-config"))

    def run(*argv):
        with pytest.raises(SystemExit) as info:
            cli_app.main(list(argv))
        return info.value.code

    return run


def _toy_plain_text(n: int) -> tuple[str, list[int]]:
    target = ToyTarget(seed=0)  # what --model toy loads
    ids = target.tokenizer.encode("hello hello world")
    tokens = plain_tokens(target, ids, n)
    return target.tokenizer.decode(tokens), tokens


def test_cli_plugins_json_lists_failures_and_the_cli_still_works(installed_evil, cli, capsys, caplog):
    with caplog.at_level(logging.WARNING):
        assert cli("plugins", "--json") in (0, None)
    records = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name, reason in DIST_REASONS.items():
        assert records[name]["status"] == FAILED and reason in records[name]["reason"], records[name]
        assert records[name]["package"] == name and records[name]["version"] == "0.1"
    assert records["evil-factory"]["status"] == LOADED
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert all(name in logged for name in DIST_REASONS)

    assert cli("list-speculators", "--json") in (0, None)
    names = {row["name"] for row in json.loads(capsys.readouterr().out)}
    assert "evil-half" not in names and "evil-factory-algo" in names

    text, tokens = _toy_plain_text(12)
    assert cli("generate", "--model", "toy", "-p", "hello hello world", "-n", "12", "--json") in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == tokens and out["text"] == text

    # the broken factory: a decline line, plain output, exit 0
    assert cli("generate", "--model", "toy", "-p", "hello hello world", "-n", "12",
               "--spec-type", "evil-factory-algo") in (0, None)
    captured = capsys.readouterr()
    assert captured.out == text + "\n"
    assert "[speculation off] plugin_error" in captured.err and "evil-factory" in captured.err


def test_cli_allow_list_blocks_the_broken_plugins(installed_evil, cli, capsys, monkeypatch):
    monkeypatch.setenv("TSSPEC_PLUGINS", "ngram,toy")  # the toy model is a plugin too
    assert cli("plugins", "--json") in (0, None)
    records = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name in DIST_PLUGINS:
        assert records[name]["status"] == BLOCKED and "TSSPEC_PLUGINS" in records[name]["reason"]
    assert records["ngram"]["status"] == LOADED
    text, _ = _toy_plain_text(10)
    assert cli("generate", "--model", "toy", "-p", "hello hello world", "-n", "10") in (0, None)
    assert capsys.readouterr().out == text + "\n"


def test_cli_subprocess_with_broken_plugins(installed_evil):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed_evil), os.environ.get("PYTHONPATH", "")])}
    for name in list(env):
        if name.startswith(("TSSPEC_", "TS_SPEC_", "TS_MTP_")):
            del env[name]
    proc = subprocess.run(
        [sys.executable, "-c", "from tsspec.cli.app import main; main()", "plugins", "--json"],
        capture_output=True, text=True, env=env, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    records = {r["name"]: r for r in json.loads(proc.stdout)}
    for name, reason in DIST_REASONS.items():
        assert records[name]["status"] == FAILED and reason in records[name]["reason"]
        assert f"plugin {name}:" in proc.stderr  # the warning names the plugin
    assert "Traceback" not in proc.stderr
