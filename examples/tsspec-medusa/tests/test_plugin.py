"""The plugin as tsspec sees it: the entry point, the hooks, and the public-API-only rule."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import tsspec
import tsspec_medusa
from tsspec.testing import plugin_catalog
from tsspec_medusa import ARCHITECTURE, attach_medusa, make_medusa

ROOT = Path(__file__).resolve().parents[1]


def test_the_distribution_declares_the_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "tsspec-medusa"
    assert project["entry-points"]["tsspec"] == {"medusa": "tsspec_medusa"}
    assert any(dep.startswith("tsspec") and not dep.startswith("tsspec-") for dep in project["dependencies"])


def test_only_the_public_api_is_imported():
    """Everything from tsspec comes through ``import tsspec`` / ``from tsspec import ...``
    (``tsspec.testing`` and its shared pytest fixtures, ``tsspec.testing_fixtures``, are public
    too, for tests): no internal module is reached into."""
    allowed = {"tsspec", "tsspec.testing", "tsspec.testing_fixtures"}
    offenders = []
    for path in sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("tsspec.") and n not in allowed]
            if isinstance(node, ast.ImportFrom) and node.module == "tsspec":
                offenders += [f"{path.name}: tsspec.{a.name}" for a in node.names if a.name not in tsspec.__all__]
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "tsspec":
                if node.attr not in tsspec.__all__ and node.attr not in ("testing", "__all__"):
                    offenders.append(f"{path.name}: tsspec.{node.attr}")
    assert offenders == []


def test_the_hooks_register_an_algorithm_a_drafter_and_a_command():
    catalog = plugin_catalog({"medusa": tsspec_medusa})
    registry = catalog.speculators
    assert registry.names() == ["medusa"] and registry.get("medusa").factory is make_medusa
    assert catalog.drafters["medusa"].function is attach_medusa

    drafters = []
    tsspec_medusa.tsspec_register_drafters(lambda archs, attach: drafters.append((archs, attach)))
    assert drafters == [([ARCHITECTURE], attach_medusa)]

    class App:  # the typer app's one method the hook uses
        commands = {}

        def command(self, name):
            return lambda fn: self.commands.setdefault(name, fn)

    app = App()
    tsspec_medusa.tsspec_register_commands(app)
    assert list(app.commands) == ["medusa-random"]


def test_loaded_by_the_plugin_host_like_any_plugin():
    record = plugin_catalog({"medusa": tsspec_medusa}).host.records["medusa"]
    assert record.status == "loaded" and tsspec_medusa.TSSPEC_CONTRACT <= tsspec.CONTRACT_VERSION
    assert record.hooks == ["tsspec_register_commands", "tsspec_register_drafters", "tsspec_register_speculators"]
    blocked = plugin_catalog({"medusa": tsspec_medusa}, disabled=["medusa"])
    assert blocked.host.records["medusa"].status == "disabled"


def test_the_command_writes_a_file_sized_for_a_model(tmp_path, capsys):
    out = tmp_path / "cmd.gguf"
    tsspec_medusa.plugin.medusa_random(str(out), model="toy", heads=2, seed=4)
    info = tsspec_medusa.read_medusa_info(out)
    assert (info.head_count, info.hidden_size, info.vocab_size) == (2, 16, 32)
    assert "wrote" in capsys.readouterr().out
    import pytest

    with pytest.raises(tsspec.TsspecError, match="give --model"):
        tsspec_medusa.plugin.medusa_random(str(tmp_path / "x.gguf"))
