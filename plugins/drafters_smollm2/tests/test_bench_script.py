"""scripts/bench_drafters.py runs each algorithm with the options ``tsspec generate`` would:
the CLI's speculation environment (TS_SPEC_ADAPTIVE...) applies, the script's flags win over
it, and a bad value is a one-line error with exit code 2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tsspec.errors import OptionsError

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench_drafters.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_drafters_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _options(bench, argv, env):
    args = bench.parser().parse_args(argv)
    return {algo: bench.algorithm_options(algo, args, env) for algo in ("draft-head", "ngram", "auto")}


def test_the_environment_applies_to_every_algorithm(bench):
    env = {"TS_SPEC_ADAPTIVE": "0", "TS_SPEC_DRAFT": "3", "TS_SPEC_PMIN": "0.25"}
    for algo, o in _options(bench, [], env).items():
        assert (o.spec_type, o.enabled, o.adaptive, o.draft, o.pmin) == (algo, True, False, 3, 0.25)
    assert all(o.adaptive for o in _options(bench, [], {}).values())  # the CLI's default: on
    assert all(not o.adaptive for o in _options(bench, [], {"TS_MTP_ADAPTIVE": "off"}).values())


def test_flags_win_over_the_environment(bench):
    env = {"TS_SPEC_ADAPTIVE": "0", "TS_SPEC_PMIN": "0.25", "TS_SPEC_TYPE": "ngram", "TS_SPEC": "0"}
    options = _options(bench, ["--spec-adaptive", "--pmin", "0.5", "--draft", "2"], env)
    assert all(o.adaptive and o.enabled for o in options.values())
    assert (options["draft-head"].pmin, options["draft-head"].draft) == (0.5, 2)  # draft-head's flags
    assert (options["ngram"].pmin, options["ngram"].draft) == (0.25, None)  # the environment's
    assert options["auto"].spec_type == "auto"  # --algorithms names what runs, not TS_SPEC_TYPE
    assert not _options(bench, ["--no-spec-adaptive"], {"TS_SPEC_ADAPTIVE": "1"})["ngram"].adaptive


def test_a_bad_value_is_a_one_line_error(bench, monkeypatch, capsys):
    with pytest.raises(OptionsError, match="TS_SPEC_ADAPTIVE='maybe' is not a boolean"):
        _options(bench, [], {"TS_SPEC_ADAPTIVE": "maybe"})
    monkeypatch.setenv("TS_SPEC_ADAPTIVE", "maybe")
    assert bench.main(["--algorithms", "ngram"]) == 2  # before any model is loaded
    assert capsys.readouterr().err.strip().splitlines() == [
        "bench_drafters: error: TS_SPEC_ADAPTIVE='maybe' is not a boolean (use 1 or 0)"]
