"""tsspec bench end to end on the toy: table, JSON, Markdown, plot, exit codes."""

from __future__ import annotations

import json

import pytest

from tsspec_bench.report import break_even_acceptance
from tsspec_bench.summary import SummaryRow
from tsspec.cli.app import main



@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"id": "q1", "class": "qa", "prompt": "the cat sat on the mat. the cat sat on the", "max_tokens": 12},
        {"id": "c1", "class": "code", "prompt": "def f(x): return x + 1. def f(x): return", "max_tokens": 12},
    ]) + "\n")
    return path


def _bench(args):
    try:
        main(["bench", *args])
    except SystemExit as exc:
        return exc.code or 0
    return 0


def test_bench_on_the_toy_writes_json_markdown_and_plot(tmp_path, prompts, capsys):
    out_json, out_md, out_png = tmp_path / "b.json", tmp_path / "B.md", tmp_path / "docs" / "b.png"
    code = _bench(["--model", "toy", "--prompts", str(prompts), "--reps", "2", "--spec-type", "ngram",
                   "--oracle-acceptance", "0,1", "--oracle-classes", "qa",
                   "--json", str(out_json), "--markdown", str(out_md), "--plot", str(out_png)])
    assert code == 0
    stdout = capsys.readouterr().out
    assert "ngram" in stdout and "lossless" in stdout

    data = json.loads(out_json.read_text())
    assert data["meta"]["model"]["name"] == "toy"
    assert data["meta"]["settings"]["reps"] == 2
    assert {c["class"] for c in data["cases"]} == {"qa", "code"}
    cells = {(r["class"], r["config"]) for r in data["summary"]}
    assert {("qa", "ngram"), ("code", "ngram"), ("all", "ngram"), ("qa", "oracle@0.00"), ("qa", "oracle@1.00")} <= cells
    assert ("code", "oracle@1.00") not in cells  # the sweep ran on qa only
    assert data["lossless"]["mismatches"] == 0
    assert data["lossless"]["identical"] == data["lossless"]["speculative_runs"] > 0
    ngram_all = next(r for r in data["summary"] if r["class"] == "all" and r["config"] == "ngram")
    assert ngram_all["pairs"] == 4 and ngram_all["ratio_min"] <= ngram_all["ratio_median"] <= ngram_all["ratio_max"]
    assert set(ngram_all["phase_ms"]) >= {"draft", "verify", "rollback", "snapshot", "commit", "plain"}
    runs = data["runs"]
    assert [r["order"] for r in runs] == list(range(len(runs)))
    timed = [r["config"] for r in runs if r["rep"] >= 0 and r["case"] == "q1"]
    one_round = ["plain", "ngram", "oracle@0.00", "oracle@1.00", "control"]
    assert timed == one_round + one_round[::-1]  # the order flips every round
    control = next(r for r in data["summary"] if r["class"] == "all" and r["config"] == "control")
    assert control["pairs"] == 4 and control["draft_tokens"] == 0
    assert data["control_band"] == {"low": control["ratio_min"], "high": control["ratio_max"], "pairs": 4}
    assert data["lossless"]["speculative_runs"] == sum(r["kind"] not in ("plain", "control") for r in runs)

    md = out_md.read_text()
    for heading in ("# tsspec benchmarks", "## Machine", "## Speculation vs plain decoding, per prompt class",
                    "## Oracle sweep", "## Losslessness", "## Reading", "## Plot"):
        assert heading in md
    assert "](docs/b.png)" in md
    table_lines = [l for l in md.splitlines() if l.startswith("|")]
    assert table_lines and all(l.count("|") == table_lines[0].count("|") for l in table_lines[:5])
    assert "Headline: ngram" in md
    assert "Control row (plain decoding against plain decoding" in md and "- **Noise**: the control row" in md
    mechanics = md[md.index("### Where the time goes"):]
    assert "| declined drafts |" in mechanics.splitlines()[4]  # keyed proposals not verified, per row
    assert all("declined_drafts" in r for r in data["summary"])

    png = out_png.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_a_lossless_failure_exits_1_and_still_writes_the_outputs(tmp_path, prompts, monkeypatch, capsys):
    from tsspec.cli import generate_cmd
    from tsspec.testing import ToyTarget

    class BrokenVerify(ToyTarget):
        def spec_forward(self, tokens, *, all_logits_rows, want_hidden):
            logits, hidden = super().spec_forward(tokens, all_logits_rows=all_logits_rows, want_hidden=want_hidden)
            if all_logits_rows and logits.shape[0] > 1:
                logits = logits.clone()
                logits[1, (int(logits[1].argmax()) + 1) % logits.shape[1]] += 100.0
            return logits, hidden

    monkeypatch.setattr(generate_cmd, "load_target", lambda *a, **k: BrokenVerify())
    out_json = tmp_path / "b.json"
    code = _bench(["--model", "toy", "--prompts", str(prompts), "--reps", "1", "--spec-type", "none",
                   "--oracle-acceptance", "1", "--no-spec-adaptive", "--json", str(out_json)])
    assert code == 1
    err = capsys.readouterr().err
    assert "LOSSLESSNESS FAILURE" in err
    data = json.loads(out_json.read_text())
    assert data["lossless"]["mismatches"] > 0
    assert data["lossless"]["details"][0]["status"] == "mismatch"


@pytest.mark.parametrize("args, message", [
    (["--spec-type", "no-such-algo"], "no such algorithm"),
    (["--oracle-acceptance", "1.5"], "between 0 and 1"),
    (["--compare", "vllm"], "choose from"),
    (["--classes", "nope"], "no prompt of class"),
])
def test_usage_errors_exit_2_with_one_line(prompts, capsys, args, message):
    assert _bench(["--model", "toy", "--prompts", str(prompts), "--reps", "1", *args]) == 2
    assert message in capsys.readouterr().err


def test_peers_need_a_gguf_and_are_reported_as_skipped(tmp_path, prompts, capsys):
    out_json = tmp_path / "b.json"
    code = _bench(["--model", "toy", "--prompts", str(prompts), "--reps", "1", "--spec-type", "none",
                   "--oracle-acceptance", "1", "--compare", "llama.cpp", "--json", str(out_json)])
    assert code == 0
    data = json.loads(out_json.read_text())
    assert "GGUF" in data["peers"]["errors"]["llama.cpp"]
    assert "skipped" in capsys.readouterr().err


def _row(p, ratio):
    return SummaryRow("all", f"oracle@{p}", "oracle", 1, 1.0, 1.0, ratio, ratio, ratio, 1, 0.0, 1.0, [], 0, 0,
                      {}, 0, 0, 0, 0, 0, 0, 1, 0, 0, acceptance_target=p)


def test_verdicts_come_from_the_control_rows_spread_not_a_fixed_threshold():
    from tsspec_bench.report import _noise_note, _verdict_word
    from tsspec_bench.summary import NoiseBand

    wide, narrow = NoiseBand(0.90, 1.08, 10), NoiseBand(0.99, 1.01, 10)
    assert _verdict_word(1.05, wide) == "is within noise" and _verdict_word(1.05, narrow) == "wins"
    assert _verdict_word(0.95, wide) == "is within noise" and _verdict_word(0.95, narrow) == "loses"
    assert _verdict_word(1.50, None) == "is unjudged (no control row)"
    assert _noise_note(1.05, wide) == " (within noise)" and _noise_note(1.05, narrow) == ""
    assert _noise_note(1.05, None) == " (unjudged: no control row)"


def test_a_control_row_of_one_or_two_pairs_calls_nothing():
    """One plain/plain pair's min-max is a single ratio: a run of one round (1.01-1.01) must not
    call 1.15x a win, nor a config that never accepted a draft a winner."""
    from tsspec_bench.report import _noise_note, _verdict_word
    from tsspec_bench.summary import NoiseBand

    one, two = NoiseBand(1.01, 1.01, 1), NoiseBand(0.98, 1.02, 2)
    assert _verdict_word(1.15, one) == "is unjudged (the control row has 1 pair: too few for a spread)"
    assert _verdict_word(0.50, two).startswith("is unjudged (the control row has 2 pairs")
    assert _noise_note(1.15, one) == " (unjudged: 1 control pair)"
    assert NoiseBand(0.98, 1.02, 3).verdict(1.15) == "wins"


def test_break_even_acceptance_interpolates_where_the_speed_up_crosses_one():
    assert break_even_acceptance([_row(0.0, 0.6), _row(0.5, 0.8), _row(1.0, 1.2)]) == pytest.approx(0.75)
    assert break_even_acceptance([_row(0.0, 0.6), _row(1.0, 0.9)]) is None


def test_compare_reps_takes_a_count_and_per_engine_counts(capsys):
    from tsspec_bench.command import _peer_reps

    names = ("transformers", "llama.cpp")
    assert _peer_reps(None, names) == (None, {})
    assert _peer_reps("2,transformers=1", names) == (2, {"transformers": 1})
    assert _peer_reps("llama.cpp=3", names) == (None, {"llama.cpp": 3})
    for bad, reason in (("transformers=0", "N >= 1"), ("two", "N >= 1"), ("vllm=2", "no peer 'vllm'")):
        assert _bench(["--model", "toy", "--compare-reps", bad]) == 2
        err = capsys.readouterr().err
        assert reason in err and len(err.strip().splitlines()) == 1
