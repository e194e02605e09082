"""``tsspec train-drafter``: one-line errors for unknown kinds and bad flags."""

from __future__ import annotations

import types

import pytest
import typer

import tsspec_training
from tsspec.hookspecs import hookimpl
from tsspec.plugins import PluginHost
from tsspec.runtime.catalog import build_catalog


def _catalog():
    mod = types.ModuleType("bundling")

    @hookimpl
    def tsspec_register_trainers(register):
        register("toykind", lambda request, target, log: {}, description="a test trainer")

    mod.tsspec_register_trainers = tsspec_register_trainers
    host = PluginHost()
    host.register(mod, "bundling")
    return build_catalog(host, discover=False)


def build_app() -> typer.Typer:
    from tsspec.cli.app import build_app as core_app

    app = core_app()
    tsspec_training.tsspec_register_commands(app)
    return app


def test_train_drafter_names_installed_kinds_on_an_unknown_kind(monkeypatch):
    from typer.testing import CliRunner

    from tsspec.cli.state import STATE

    monkeypatch.setattr(STATE, "catalog", _catalog())
    result = CliRunner().invoke(build_app(), ["train-drafter", "--kind", "nope", "--out", "x.gguf"])
    assert result.exit_code != 0
    assert "installed kinds: toykind" in str(result.exception) or "installed kinds: toykind" in result.output


@pytest.mark.parametrize("flags, named", [
    (["--recommend-pmin", "1.5"], "--recommend-pmin"),
    (["--recommend-draft", "0"], "--recommend-draft"),
    (["--held-out-prompts", "-1"], "--held-out-prompts"),
    (["--answer-share", "1.2"], "--answer-share must be between 0 and 1"),
    (["--restart-share", "-0.1"], "--restart-share must be between 0 and 1"),
    (["--vocab-answer-share", "2"], "--vocab-answer-share must be between 0 and 1"),
    (["--more-prompts", "-3"], "--more-prompts"),
    (["--init-from", "no-such-drafter.gguf"], "--init-from no-such-drafter.gguf: no such file"),
    (["--ce-weight", "0"], "--ce-weight 0 needs --kl-weight > 0"),
    (["--ce-weight", "-1"], "--ce-weight, --kl-weight and --confident-weight must be at least 0"),
    (["--confident-weight", "1", "--soft-k", "0"], "--confident-weight reads the target's top-k logits"),
    (["--ce-weight", "0", "--kl-weight", "0.5", "--soft-k", "0"], "--soft-k must be at least 1"),
    (["--layer-lr-scale", "0"], "--layer-lr-scale must be above 0"),
])
def test_train_drafter_refuses_bad_recommendations_in_one_line(monkeypatch, flags, named):
    from typer.testing import CliRunner

    from tsspec.cli.state import STATE

    monkeypatch.setattr(STATE, "catalog", _catalog())
    result = CliRunner().invoke(build_app(), ["train-drafter", "--kind", "toykind", "--out", "x.gguf", *flags])
    assert result.exit_code != 0
    assert named in str(result.exception) or named in result.output
