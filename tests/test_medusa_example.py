"""examples/tsspec-medusa installed the way a user installs a third-party plugin.

A fresh virtual environment beside tsspec gets the example with a plain, non-editable
``pip install`` (built from a copy of the source, so the checkout stays clean). Building a venv
with torch from scratch would take minutes, so the fresh venv sees this environment's
site-packages (tsspec, torch and the built-in plugins) through one ``.pth`` line; the example
itself exists only in the fresh venv. Then, through the ``tsspec`` command line:

* ``tsspec plugins --json`` lists ``medusa`` with its package and version;
* ``tsspec list-speculators --model ... --json`` shows ``medusa`` declining for want of its
  Medusa file (on the toy target, and on the embedded SmolLM2 when the llama plugin is there);
* generation with a random-weight Medusa file (written by the plugin's own command) gives the
  tokens of ``--no-spec``, greedy and sampled;
* each operator control (``--disable-plugin``, ``--plugins``, ``TSSPEC_PLUGINS``,
  ``TSSPEC_DISABLE_PLUGINS``, ``tsspec.toml [plugins] disabled`` via ``--config``) removes it.

Every CLI start imports torch (seconds on a busy machine), so the first checks run as real
``python -m tsspec.cli.app`` processes and the rest through one driver process that calls the
same ``main(argv)`` once per command line, with the environment restored between calls.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tsspec-medusa"
CLI = ["-m", "tsspec.cli.app"]
PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown"
MAX_TOKENS = "40"
SAMPLED = ["--temperature", "0.8", "--top-k", "20", "--seed", "3"]
INSTALL_TIMEOUT_S = 240
CLI_TIMEOUT_S = 180

# (label, extra argv before the command, extra environment, expected status)
CONTROLS = [
    ("--disable-plugin", ["--disable-plugin", "medusa"], {}, "disabled"),
    ("--plugins", ["--plugins", "ngram,toy"], {}, "blocked"),
    ("TSSPEC_PLUGINS", [], {"TSSPEC_PLUGINS": "ngram,toy"}, "blocked"),
    ("TSSPEC_DISABLE_PLUGINS", [], {"TSSPEC_DISABLE_PLUGINS": "medusa"}, "disabled"),
    ("tsspec.toml", ["--config", "{config}"], {}, "disabled"),
]

DRIVER = textwrap.dedent(
    """
    # Runs tsspec's CLI entry point once per command line in this one process.
    import contextlib, io, json, os, sys
    from tsspec.cli.app import main

    def run(argv, env):
        saved = dict(os.environ)
        os.environ.update(env)
        out, err, code = io.StringIO(), io.StringIO(), 0
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os.environ.clear()
            os.environ.update(saved)  # generate publishes TS_* options: do not leak them
        return {"argv": argv, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}

    cases = json.load(open(sys.argv[1]))
    results = {label: run(argv, env) for label, argv, env in cases}
    import tsspec_medusa  # where the plugin was imported from

    results["_module"] = tsspec_medusa.__file__
    json.dump(results, open(sys.argv[2], "w"))
    """
)


def _clean_env(home: Path) -> dict[str, str]:
    """No operator settings: no TS_* / TSSPEC_* variables, no PYTHONPATH, an empty config dir."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TS_SPEC_", "TS_MTP_", "TSSPEC_", "PYTHON", "PIP_"))
    }
    env["XDG_CONFIG_HOME"] = str(home / "config")
    return env


class Installed:
    """The fresh venv with the example installed, and the results of every command run in it."""

    def __init__(self, root: Path):
        self.root = root
        self.venv = root / "venv"
        self.python = self.venv / "bin" / "python"
        self.work = root / "work"  # cwd of every command: no ./tsspec.toml there
        self.work.mkdir()
        (root / "config").mkdir()
        self.env = _clean_env(root)
        self.heads = root / "heads.gguf"
        self.config = root / "medusa-off.toml"
        self.config.write_text('[plugins]\ndisabled = ["medusa"]\n')
        self.site: Path | None = None
        self.driver: dict[str, dict] = {}
        self.cli: dict[str, dict] = {}

    def run(self, args, *, timeout=CLI_TIMEOUT_S, env=None):
        proc = subprocess.run(
            [str(self.python), *args], cwd=self.work, env=env or self.env,
            capture_output=True, text=True, timeout=timeout,
        )
        return {"code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}

    def install(self) -> None:
        source = self.root / "tsspec-medusa"
        shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.venv)], check=True, timeout=120)
        self.site = Path(
            subprocess.check_output(
                [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                text=True, env=self.env,
            ).strip()
        )
        # addsitedir (not a bare path line) so the editable installs' own .pth hooks run too
        here = sysconfig.get_paths()["purelib"]
        (self.site / "tsspec_parent_env.pth").write_text(f"import site; site.addsitedir({here!r})\n")
        result = self.run(
            ["-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
             "--disable-pip-version-check", "--quiet", str(source)],
            timeout=INSTALL_TIMEOUT_S,
        )
        assert result["code"] == 0, f"pip install failed:\n{result['stdout']}\n{result['stderr']}"

    def drive(self, cases: list[tuple[str, list[str], dict[str, str]]]) -> None:
        (self.root / "driver.py").write_text(DRIVER)
        (self.root / "cases.json").write_text(json.dumps(cases))
        result = self.run([str(self.root / "driver.py"), str(self.root / "cases.json"), str(self.root / "out.json")])
        assert result["code"] == 0, f"driver failed:\n{result['stderr'][-3000:]}"
        self.driver = json.loads((self.root / "out.json").read_text())


def embedded_model() -> str | None:
    """The embedded SmolLM2 GGUF when the llama plugin that serves it is importable."""
    if importlib.util.find_spec("tsspec_model_llama") is None:
        return None
    from tsspec_gguf.embedded import embedded_model_path

    return str(embedded_model_path())


def _driver_cases(installed: Installed, embedded: str | None) -> list:
    heads, gen = str(installed.heads), ["generate", "--model", "toy", "-p", PROMPT, "-n", MAX_TOKENS, "--json"]
    cases = [
        ("write", ["medusa-random", heads, "--model", "toy", "--heads", "3", "--seed", "1"], {}),
        ("plain", [*gen, "--no-spec"], {}),
        ("plain-sampled", [*gen, "--no-spec", *SAMPLED], {}),
        ("medusa-sampled", [*gen, "--spec-type", "medusa", "--spec-draft-model", heads, "--no-spec-adaptive", *SAMPLED], {}),
    ]
    for label, argv, env, _ in CONTROLS:
        argv = [a.replace("{config}", str(installed.config)) for a in argv]
        cases.append((f"{label}/plugins", [*argv, "plugins", "--json"], env))
        cases.append((f"{label}/generate", [*argv, *gen, "-n", "8", "--spec-type", "medusa"], env))
    # the core names no algorithm: with only this third-party one, or none at all, the listing
    # and `auto` still say something true
    for label, allowed in (("only-medusa", "toy,medusa"), ("no-algorithm", "toy")):
        cases.append((f"{label}/list", ["--plugins", allowed, "list-speculators", "--model", "toy"], {}))
        cases.append((f"{label}/auto", ["--plugins", allowed, *gen, "-n", "4", "--spec-type", "auto"], {}))
    if embedded is not None:
        cases.append(("embedded", ["list-speculators", "--model", embedded, "--json"], {}))
    return cases


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    inst = Installed(tmp_path_factory.mktemp("medusa-example"))
    inst.install()
    inst.drive(_driver_cases(inst, embedded_model()))
    inst.cli["plugins"] = inst.run([*CLI, "plugins", "--json"])
    inst.cli["list"] = inst.run([*CLI, "list-speculators", "--model", "toy", "--json"])
    inst.cli["medusa"] = inst.run(
        [*CLI, "generate", "--model", "toy", "-p", PROMPT, "-n", MAX_TOKENS, "--json",
         "--spec-type", "medusa", "--spec-draft-model", str(inst.heads), "--no-spec-adaptive"]
    )
    return inst


def _ok(result: dict) -> str:
    assert result["code"] == 0, f"exit {result['code']}:\n{result['stderr'][-3000:]}"
    return result["stdout"]


def _medusa(rows: list[dict]) -> dict | None:
    return next((row for row in rows if row["name"] == "medusa"), None)


def test_installed_as_a_regular_distribution(installed):
    """Not editable, and what the commands ran is the copy in the fresh venv."""
    package = installed.site / "tsspec_medusa" / "__init__.py"
    assert package.is_file()
    (dist_info,) = installed.site.glob("tsspec_medusa-0.1.0.dist-info")
    direct = json.loads((dist_info / "direct_url.json").read_text())
    assert not direct.get("dir_info", {}).get("editable", False)
    assert Path(installed.driver["_module"]).resolve() == package.resolve()


def test_plugins_lists_it_with_its_version(installed):
    record = _medusa(json.loads(_ok(installed.cli["plugins"])))
    assert record is not None, "medusa missing from tsspec plugins --json"
    assert record["package"] == "tsspec-medusa" and record["version"] == "0.1.0"
    assert record["status"] == "loaded" and record["reason"] is None
    assert set(record["hooks"]) == {
        "tsspec_register_speculators", "tsspec_register_drafters", "tsspec_register_commands"
    }


def _assert_declines_for_want_of_its_file(row: dict | None) -> None:
    assert row is not None, "medusa missing from list-speculators"
    assert row["plugin"] == "medusa" and row["version"] == "0.1.0" and row["requires_draft_head"]
    assert row["status"] == "declined" and row["code"] == "no_draft_head"
    assert "Medusa" in row["reason"] and "--spec-draft-model" in row["reason"]


def test_list_speculators_names_the_missing_medusa_file(installed):
    _assert_declines_for_want_of_its_file(_medusa(json.loads(_ok(installed.cli["list"]))))


def test_list_speculators_on_the_embedded_model(installed):
    if embedded_model() is None:
        pytest.skip("tsspec_model_llama (serves the embedded SmolLM2) is not installed")
    _assert_declines_for_want_of_its_file(_medusa(json.loads(_ok(installed.driver["embedded"]))))


def test_random_medusa_file_generates_losslessly(installed):
    assert "wrote" in _ok(installed.driver["write"])
    plain = json.loads(_ok(installed.driver["plain"]))
    spec = json.loads(_ok(installed.cli["medusa"]))
    assert spec["speculator"] == "medusa" and spec["decline"] is None
    assert spec["stats"]["draft_tokens"] > 0 and spec["stats"]["faults"] == 0
    assert len(plain["tokens"]) == int(MAX_TOKENS)
    assert spec["tokens"] == plain["tokens"]


def test_seeded_sampling_is_lossless_too(installed):
    plain = json.loads(_ok(installed.driver["plain-sampled"]))
    spec = json.loads(_ok(installed.driver["medusa-sampled"]))
    assert spec["speculator"] == "medusa" and spec["stats"]["draft_tokens"] > 0
    assert spec["tokens"] == plain["tokens"]


@pytest.mark.parametrize("label,status", [(c[0], c[3]) for c in CONTROLS])
def test_each_operator_control_removes_it(installed, label, status):
    record = _medusa(json.loads(_ok(installed.driver[f"{label}/plugins"])))
    assert record is not None and record["status"] == status and record["hooks"] == []
    assert record["reason"]
    # --spec-type medusa no longer names a known algorithm: the CLI stops with a one-line error
    # that lists the known ones (the Python API declines with unknown_algorithm instead)
    result = installed.driver[f"{label}/generate"]
    assert result["code"] == 2, result
    assert "unknown --spec-type 'medusa'" in result["stderr"]
    assert "medusa" not in result["stderr"].split("known:")[1]


def test_with_only_a_third_party_algorithm_or_none_the_cli_tells_the_truth(installed):
    listing = _ok(installed.driver["only-medusa/list"])
    assert listing.startswith("medusa") and "ngram" not in listing
    assert "no weight-free algorithm is installed" in listing  # medusa's decline, on the toy
    assert "auto -> no_draft_head" in listing and "none is installed" in listing
    auto = json.loads(_ok(installed.driver["only-medusa/auto"]))
    assert auto["speculator"] is None and auto["decline"]["code"] == "no_draft_head"
    assert "ngram" not in auto["decline"]["reason"]
    plain = json.loads(_ok(installed.driver["plain"]))
    assert auto["tokens"] == plain["tokens"][:4]  # declined speculation still generates
    nothing = _ok(installed.driver["no-algorithm/list"])
    assert "no speculation algorithms registered" in nothing and "none is installed" in nothing
    assert json.loads(_ok(installed.driver["no-algorithm/auto"]))["decline"]["code"] == "no_draft_head"
