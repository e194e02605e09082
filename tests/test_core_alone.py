"""The core runs with no plugin but the toy model: every other ``tsspec_*`` package is hidden
from import in a fresh process, and the CLI shell still generates, lists and reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HIDE_PLUGINS = '''
import importlib.abc, sys

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top.startswith("tsspec_") and top != "tsspec_model_toy":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Hide())
from tsspec.cli.app import main
main(sys.argv[1:])
'''


def run_core(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TS_SPEC_", "TS_MTP_", "TSSPEC_"))}
    env["TSSPEC_PLUGINS"] = "toy"
    return subprocess.run([sys.executable, "-c", HIDE_PLUGINS, *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_generate_on_the_toy_with_only_the_core():
    done = run_core("generate", "--model", "toy", "-p", "hello", "-n", "8", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert len(out["tokens"]) == 8 and out["decline"]["code"] == "no_draft_head"


@pytest.mark.parametrize("args", [("list-speculators", "--model", "toy", "--json"), ("plugins", "--json"),
                                  ("models", "--json")])
def test_the_cli_shell_reports_with_only_the_core(args):
    done = run_core(*args)
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)


def test_a_hidden_plugin_really_is_hidden():
    done = run_core("generate", "-p", "hello", "-n", "2")
    assert done.returncode == 2 and "default model" in done.stderr
