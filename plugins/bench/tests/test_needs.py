"""What a drafter needs (bench.needs) on synthetic numbers, the report's section built from a
run's rows, and the oracle sweep capped at a short draft length, end to end on the toy."""

from __future__ import annotations

import doctest
import json

import pytest

from tsspec_bench import needs
from tsspec_bench.needs import (DrafterMeasure, acceptance_for, draft_lengths, drafter_needs, expected_tokens,
                                length_needs, relative_costs, shape_from_steps)
from tsspec_bench.report import BenchReport, drafter_needs_of, loop_verify_cost, placements, sweep_length_for
from tsspec_bench.runner import BenchConfig, RunRecord
from tsspec_bench.suite import build_configs, check_oracle_draft
from tsspec_bench.summary import SummaryRow
from tsspec.cli.app import main
from tsspec.errors import OptionsError
from tsspec.runtime.stats import SpecStats

# a CPU like the one the issue describes: 2 rows 1.22x one row, 3 rows 1.5x, 9 rows 3.9x
PROFILE = ((1, 8.0), (2, 9.76), (3, 12.0), (4, 14.0), (9, 31.2))


def test_the_docstring_examples_hold():
    assert doctest.testmod(needs).failed == 0


def test_expected_tokens_is_the_geometric_chain():
    assert expected_tokens(0.5, 3) == pytest.approx(1.875)
    assert expected_tokens(0.9, 0) == 1.0


def test_acceptance_for_solves_the_chain_and_says_when_nothing_reaches_it():
    a = acceptance_for(1.4, 2, 1.5)  # 1 + a + a^2 = 2.1
    assert expected_tokens(a, 2) == pytest.approx(2.1)
    assert a == pytest.approx((-1 + (1 + 4 * 1.1) ** 0.5) / 2)
    assert acceptance_for(1.4, 1, 1.5) is None  # 1.4 * 1.5 = 2.1 tokens > 2: not even a = 1
    assert acceptance_for(1.0, 1, 0.8) == 0.0  # cheaper than a plain step: pays at a = 0
    assert acceptance_for(1.0, 0, 1.0) is None and acceptance_for(1.0, 1, 0.0) is None


def test_relative_costs_interpolate_the_profile_and_refuse_a_missing_one():
    costs = relative_costs(PROFILE, (2, 3, 9, 6))
    assert costs[2] == pytest.approx(1.22) and costs[3] == pytest.approx(1.5) and costs[9] == pytest.approx(3.9)
    assert costs[6] == pytest.approx((14.0 + 2 * (31.2 - 14.0) / 5) / 8.0)
    assert relative_costs(None, (2,)) is None
    assert relative_costs("not a table", (2,)) is None
    assert relative_costs(((2, 5.0), (3, 6.0)), (2,)) is None  # no 1-row point


def test_shape_from_steps_needs_a_plain_step_and_a_verify_step():
    assert shape_from_steps(7.0, {3: 9.0}) == ((1, 7.0), (3, 9.0))
    assert shape_from_steps(None, {3: 9.0}) is None
    assert shape_from_steps(7.0, {}) is None
    assert shape_from_steps(7.0, {3: 0.0}) is None


def test_draft_lengths_are_1_2_3_and_the_window_within_it():
    assert draft_lengths(8) == [1, 2, 3, 8]
    assert draft_lengths(3) == [1, 2, 3]
    assert draft_lengths(1) == [1]


def test_length_needs_with_free_and_with_costly_drafting():
    costs = relative_costs(PROFILE, (2, 3, 4, 9))
    free = {n.k: n for n in length_needs(costs, [1, 2, 3, 8])}
    assert free[1].break_even == pytest.approx(0.22) and free[1].goal == pytest.approx(0.708)
    assert free[1].ceiling == pytest.approx(2 / 1.22)
    assert free[2].goal == pytest.approx(acceptance_for(1.4, 2, 1.5))
    assert free[8].ceiling == pytest.approx(9 / 3.9)
    paid = {n.k: n for n in length_needs(costs, [1, 2], draft_share=0.2)}
    assert paid[2].draft_cost == pytest.approx(0.4) and paid[2].cost == pytest.approx(1.9)
    assert paid[2].goal > free[2].goal and paid[2].ceiling < free[2].ceiling
    assert length_needs({2: 1.2}, [1, 2]) == length_needs({2: 1.2}, [1])  # 3 rows unmeasured: k = 2 left out


def test_a_weak_drafter_is_stopped_by_its_acceptance():
    costs = relative_costs(PROFILE, (2, 3, 4, 9))
    head = DrafterMeasure("head", 0.8, 1.2, [0.41, 0.05], 0.97, 80, 1.43)
    section = drafter_needs(costs, "profile", 8, 8.0, [head])
    d = section.drafters[0]
    assert d.draft_share == pytest.approx(0.1)
    least = min((n for n in d.needs if n.goal is not None), key=lambda n: n.goal)
    assert d.verdict.startswith(f"1.4x needs a >= {least.goal:.2f} at k = {least.k} at its draft cost (0.10 of")
    assert "lands 0.41" in d.verdict and "acceptance stops it (free drafting would still need a >= 0.6" in d.verdict
    assert "break-even" not in d.verdict  # 0.41 clears the break-even at k = 1 (0.22 + 0.1)
    weaker = drafter_needs(costs, "profile", 8, 8.0, [DrafterMeasure("head", 0.8, 1.0, [0.1], 0.8, 80, 1.1)])
    assert "below even the break-even" in weaker.drafters[0].verdict


def test_a_perfect_short_drafter_is_stopped_by_the_verify_cost():
    costs = {2: 1.6, 3: 2.3, 4: 3.0}  # a steep machine: a perfect 1-token drafter reaches 1.25x
    section = drafter_needs(costs, "profile", 3, 8.0, [DrafterMeasure("head", 0.0, 1.0, [0.99], 1.1, 80, 1.99)])
    assert section.machine[0].ceiling == pytest.approx(2 / 1.6)
    assert "the verify cost by rows stops every drafter" in section.machine_verdict
    assert "the verify cost by rows stops it" in section.drafters[0].verdict


def test_a_drafter_whose_draft_cost_stops_it():
    costs = relative_costs(PROFILE, (2, 3, 4))
    section = drafter_needs(costs, "profile", 3, 8.0, [DrafterMeasure("slow", 8.0, 1.0, [0.95], 0.6, 80, 1.95)])
    d = section.drafters[0]
    assert d.draft_share == pytest.approx(1.0)
    assert all(n.goal is None for n in d.needs)
    assert d.verdict.endswith("its draft cost stops it.")


def test_a_drafter_with_enough_acceptance_for_free_drafting_is_stopped_by_its_draft_cost():
    costs = relative_costs(PROFILE, (2, 3, 4, 9))
    free_least = min(n.goal for n in length_needs(costs, [1, 2, 3, 8]) if n.goal is not None)
    d = drafter_needs(costs, "profile", 8, 8.0, [DrafterMeasure("slowish", 2.4, 1.0, [0.8], 1.0, 80, 1.8)]).drafters[0]
    assert free_least <= 0.8 < min(n.goal for n in d.needs if n.goal is not None)
    assert "its draft cost stops it (with free drafting" in d.verdict


def test_a_good_drafter_clears_the_goal():
    costs = relative_costs(PROFILE, (2, 3, 4, 9))
    one = drafter_needs(costs, "profile", 8, 8.0, [DrafterMeasure("good", 0.0, 1.0, [0.9], 1.5, 80, 1.9)]).drafters[0]
    least = min((n for n in one.needs if n.goal is not None), key=lambda n: n.goal)
    assert 0.9 >= least.goal and "acceptance stops it" not in one.verdict


def test_no_cost_profile_and_no_algorithm_are_said_plainly():
    section = drafter_needs(None, None, 8, 8.0, [DrafterMeasure("head", 0.8, 1.2, [0.4], 0.97)])
    assert section.machine == [] and section.source is None
    assert section.machine_verdict.startswith("No cost by rows was measured")
    assert section.drafters[0].needs == [] and "nothing to weigh" in section.drafters[0].verdict
    alone = drafter_needs(relative_costs(PROFILE, (2, 3, 4, 9)), "profile", 8, 8.0, [])
    assert alone.drafters == [] and alone.machine
    assert json.loads(json.dumps(section.to_json()))["relative_cost_by_rows"] is None
    nothing_drafted = drafter_needs(relative_costs(PROFILE, (2, 3)), "profile", 2, None,
                                    [DrafterMeasure("idle", None, 0.0, [], None)])
    assert nothing_drafted.drafters[0].draft_share is None and nothing_drafted.drafters[0].worth is None
    assert "only 0 of its drafts reached a verify in this run: too few to weigh" in nothing_drafted.drafters[0].verdict


def test_a_drafter_with_too_few_verified_drafts_gets_no_verdict_on_its_cost_or_acceptance():
    costs = relative_costs(PROFILE, (2, 3, 4, 9))
    # one verified draft that landed, after many passes cut to nothing: its d is meaningless
    d = drafter_needs(costs, "profile", 8, 8.0, [DrafterMeasure("block", 36.0, 1.0, [1.0], 0.9, 1, 2.0)]).drafters[0]
    assert d.verdict.endswith("only 1 of its drafts reached a verify in this run: too few to weigh.")
    assert "stops it" not in d.verdict


def test_cost_at_a_fractional_length_and_the_worth_of_a_drafters_steps():
    costs = relative_costs(PROFILE, range(2, 10))
    assert needs.cost_at(costs, 2.0) == pytest.approx(1.22)
    assert needs.cost_at(costs, 2.5) == pytest.approx((1.22 + 1.5) / 2)
    assert needs.cost_at(costs, 10.5) is None
    m = DrafterMeasure("head", 0.8, 1.5, [0.4, 0.1], 1.0, 60, 1.5)
    section = drafter_needs(costs, "profile", 8, 8.0, [m])
    assert section.drafters[0].worth == pytest.approx(1.5 / ((1.22 + 1.5) / 2 + 1.5 * 0.1))
    assert "worth" not in section.drafters[0].verdict  # acceptance stops it: no claim about its worth
    good = drafter_needs(costs, "profile", 8, 8.0, [DrafterMeasure("good", 0.0, 1.0, [0.9], 1.2, 60, 1.9)])
    assert "Its verify steps are worth 1.56x by these costs; it measured 1.20x" in good.drafters[0].verdict


# -- the report's section and placements, from rows -----------------------------------------

def _row(config, kind, *, accepted=(), draft_tokens=0, verify_steps=0, draft_ms=0.0, verify_ms=0.0, ratio=1.0,
         p=None):
    return SummaryRow("all", config, kind, 1, 1.0, 1.0, ratio, ratio, ratio, 1, 0.0, 1.0, list(accepted),
                      draft_tokens, 0, {"draft": draft_ms, "verify": verify_ms}, 0, 0, 0, verify_steps,
                      verify_steps, 0, 1, 0, 0, acceptance_target=p)


def _report(rows, *, profile=None, lengths=None, window=8):
    lengths = lengths or {}
    meta = {"settings": {"window": window, "adaptive": True, "verify_row_ms": profile, "oracle_classes": None,
                         "oracle_governed": {name: False for name in lengths}, "oracle_draft_lengths": lengths}}
    return BenchReport(meta, [], [], rows, ["qa"])


def test_the_section_reads_the_profile_and_leaves_auto_out():
    rows = [_row("draft-head", "algorithm", accepted=[0.4, 0.05], draft_tokens=100, verify_steps=80, draft_ms=60.0),
            _row("auto", "algorithm", accepted=[0.6], draft_tokens=50, verify_steps=40)]
    section = drafter_needs_of(_report(rows, profile=[list(p) for p in PROFILE]))
    assert section.source == "profile" and section.costs[2] == pytest.approx(1.22)
    assert [d.measure.name for d in section.drafters] == ["draft-head"]
    head = section.drafters[0].measure
    assert head.draft_ms_per_token == pytest.approx(0.6) and head.drafted_per_verify == pytest.approx(1.25)
    assert section.plain_ms is None and section.drafters[0].draft_share is None  # no plain runs recorded


def _record(config, kind, rep, *, plain=(0.0, 0), verify=(0.0, 0), case="q1"):
    stats = SpecStats(plain_steps=plain[1], verify_steps=verify[1])
    stats.phase_ms.update(plain=plain[0], verify=verify[0])
    return RunRecord(case, "qa", config, kind, rep, 0, [], stats, None)


def test_the_loop_steps_are_paired_with_the_plain_run_of_their_round_and_preferred_to_the_profile():
    lengths = {"oracle@1.00/no-governor": 8, "oracle@1.00/draft2/no-governor": 2, "oracle@1.00": 8}
    records = [
        _record("plain", "plain", -1, plain=(500.0, 10)),  # warm-up: not counted
        _record("oracle@1.00/draft2/no-governor", "oracle", -1, verify=(10.0, 10)),
        _record("plain", "plain", 0, plain=(70.0, 10)),  # 7 ms a step
        _record("oracle@1.00/no-governor", "oracle", 0, verify=(280.0, 10)),  # 28 ms: 4x
        _record("oracle@1.00/draft2/no-governor", "oracle", 0, verify=(84.0, 10)),  # 8.4 ms: 1.2x
        _record("oracle@1.00", "oracle", 0, verify=(10.0, 10)),  # governor on: drafts vary, left out
        _record("plain", "plain", 1, plain=(140.0, 10)),  # a slow round: 14 ms a step
        _record("oracle@1.00/no-governor", "oracle", 1, verify=(560.0, 10)),  # 4x of its own round
        _record("oracle@1.00/draft2/no-governor", "oracle", 1, verify=(196.0, 10)),  # 1.4x
    ]
    rep = _report([], profile=[list(p) for p in PROFILE], lengths=lengths)
    rep.meta["settings"]["oracle_governed"]["oracle@1.00"] = True
    rep.records = records
    assert loop_verify_cost(rep) == {3: pytest.approx(1.3), 9: pytest.approx(4.0)}
    section = drafter_needs_of(rep)
    assert section.source == "steps"
    assert section.costs[3] == pytest.approx(1.3) and section.costs[9] == pytest.approx(4.0)
    assert section.costs[2] == pytest.approx(1.15)  # linear between 1 and 3 rows
    assert section.beside == {"profile": pytest.approx(relative_costs(PROFILE, range(2, 10)))}  # for comparison
    short = _report([], profile=[list(p) for p in PROFILE], lengths=lengths)
    short.records = [r for r in records if "draft2" in r.config or r.kind == "plain"]
    assert drafter_needs_of(short).source == "profile"  # the steps stop at 3 rows: no extrapolation to 9
    missing = drafter_needs_of(_report([]))
    assert missing.costs is None and missing.machine == []
    timed = _report([], profile=[list(p) for p in PROFILE], lengths=lengths)
    timed.records = records
    timed.meta["row_cost"] = {"context": 100, "rounds": 9, "one_row_ms": 6.0,
                              "cost": {r: 1.0 + 0.1 * (r - 1) for r in range(2, 10)}}
    first = drafter_needs_of(timed)  # the bench's own timing first, the others beside it
    assert first.source == "bench" and first.costs[5] == pytest.approx(1.4)
    assert list(first.beside) == ["steps", "profile"]
    timed.meta["row_cost"]["cost"] = {2: 1.1, 3: 1.2}  # short of the window's 9 rows: not used
    assert drafter_needs_of(timed).source == "steps"


def test_row_costs_are_timed_on_a_target_that_rewinds_and_skipped_on_one_that_cannot():
    from tsspec_bench.row_cost import measure_row_costs
    from tsspec.testing import ToyTarget

    target = ToyTarget(seed=0, recurrent=False)  # its state is all in the KV cache
    stream = list(range(3, 60))
    out = measure_row_costs(target, stream, range(2, 6), context=20, rounds=3)
    assert out["context"] == 20 and out["rounds"] == 3 and set(out["cost"]) == {2, 3, 4, 5}
    assert all(c > 0 for c in out["cost"].values()) and out["one_row_ms"] > 0
    assert target.cache_seq_len == 0  # left as a fresh sequence
    assert measure_row_costs(ToyTarget(seed=0, recurrent=True), stream, range(2, 6), context=20) is None
    assert measure_row_costs(target, stream[:22], range(2, 6), context=20) is None  # too few tokens


def test_placements_read_each_algorithm_off_the_sweep_of_its_draft_length():
    lengths = {"oracle@0.00/no-governor": 8, "oracle@1.00/no-governor": 8,
               "oracle@0.00/draft2/no-governor": 2, "oracle@1.00/draft2/no-governor": 2}
    rows = [_row("oracle@0.00/no-governor", "oracle", ratio=0.2, p=0.0),
            _row("oracle@1.00/no-governor", "oracle", ratio=2.2, p=1.0),
            _row("oracle@0.00/draft2/no-governor", "oracle", ratio=0.6, p=0.0),
            _row("oracle@1.00/draft2/no-governor", "oracle", ratio=1.6, p=1.0),
            _row("head", "algorithm", accepted=[0.5], draft_tokens=18, verify_steps=10, ratio=0.97),
            _row("long", "algorithm", accepted=[0.5], draft_tokens=70, verify_steps=10, ratio=1.1)]
    rep = _report(rows, lengths=lengths)
    placed = {pl.name: pl for pl in placements(rep)}
    assert placed["head"].sweep_length == 2 and placed["head"].at == pytest.approx(1.1)
    assert placed["long"].sweep_length == 8 and placed["long"].at == pytest.approx(1.2)
    assert [r.config for r in rep.sweep_rows()] == ["oracle@0.00/no-governor", "oracle@1.00/no-governor"]
    assert rep.capped_lengths() == [2]
    only_window = _report(rows[:2] + rows[4:], lengths=lengths)
    assert {pl.sweep_length for pl in placements(only_window)} == {8}
    assert sweep_length_for(2.5, [1, 2, 8]) == 2  # 2.5 rounds to 3: the nearest sweep, 2


# -- the capped sweep's configurations and the flag -----------------------------------------

def test_the_capped_sweep_runs_governor_off_beside_the_sweep_as_it_was():
    configs = build_configs(["ngram"], [0.0, 1.0], ["qa"], (False, True), [2])
    names = [c.name for c in configs]
    assert names == ["plain", "ngram", "oracle@0.00/no-governor", "oracle@1.00/no-governor", "oracle@0.00",
                     "oracle@1.00", "oracle@0.00/draft2/no-governor", "oracle@1.00/draft2/no-governor", "control"]
    capped = configs[-2]
    assert capped.max_draft == 2 and capped.adaptive is False and capped.classes == frozenset({"qa"})
    assert build_configs([], [1.0], None) == [BenchConfig.plain(), BenchConfig.oracle(1.0), BenchConfig.control()]
    with pytest.raises(ValueError):
        BenchConfig.oracle(0.5, max_draft=0)


def test_draft_caps_must_sit_below_the_window_and_need_p_values():
    check_oracle_draft([], [], 8)
    check_oracle_draft([1, 7], [0.5], 8)
    with pytest.raises(OptionsError, match="needs --oracle-acceptance"):
        check_oracle_draft([2], [], 8)
    with pytest.raises(OptionsError, match="choose 1..7"):
        check_oracle_draft([8], [0.5], 8)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"id": "q1", "class": "qa", "prompt": "the cat sat on the mat. the cat sat on the", "max_tokens": 16},
        {"id": "c1", "class": "code", "prompt": "def f(x): return x + 1. def f(x): return", "max_tokens": 16},
    ]) + "\n")
    return path


def _bench(args):
    try:
        main(["bench", *args])
    except SystemExit as exc:
        return exc.code or 0
    return 0


def test_bench_with_a_capped_sweep_on_the_toy(tmp_path, prompts):
    out_json, out_md = tmp_path / "b.json", tmp_path / "B.md"
    code = _bench(["--model", "toy", "--prompts", str(prompts), "--reps", "1", "--spec-type", "ngram",
                   "--oracle-acceptance", "0,1", "--oracle-classes", "qa", "--oracle-governor", "off",
                   "--oracle-draft", "2", "--no-spec-adaptive", "--json", str(out_json), "--markdown", str(out_md)])
    assert code == 0
    data = json.loads(out_json.read_text())
    settings = data["meta"]["settings"]
    assert settings["oracle_draft"] == [2]
    assert settings["oracle_draft_lengths"]["oracle@1.00/draft2/no-governor"] == 2
    assert settings["oracle_draft_lengths"]["oracle@1.00/no-governor"] == settings["window"] == 8
    by_config = {r["config"]: r for r in data["summary"] if r["class"] == "all"}
    capped, full = by_config["oracle@1.00/draft2/no-governor"], by_config["oracle@1.00/no-governor"]
    assert len(capped["accepted_per_position"]) == 2  # never a third drafted token
    assert capped["draft_tokens"] <= 2 * capped["verify_steps"] and full["draft_tokens"] > 2 * full["verify_steps"]
    assert capped["mismatches"] == 0 and capped["identical"] == capped["runs"]
    assert all(r["lossless"]["status"] == "identical" for r in data["runs"] if r["kind"] == "oracle")
    needs_json = data["drafter_needs"]
    # the toy keeps recurrent state (it cannot be timed by rows after a rewind) and publishes no
    # profile: the section reads the loop's own steps
    assert data["meta"]["row_cost"] is None
    assert needs_json["source"] == "steps" and needs_json["other_sources"] == {}
    assert set(needs_json["relative_cost_by_rows"]) == {str(r) for r in range(2, 10)}
    assert [d["name"] for d in needs_json["drafters"]] == ["ngram"]
    assert by_config["ngram"]["verify_steps"] > 0  # governor off: ngram verifies what it finds
    md = out_md.read_text()
    assert "### The sweep with drafts capped at 2 tokens" in md
    assert "## What a drafter needs on this machine" in md
    assert "- **ngram**: " in md
    assert "| ngram | " in md[md.index("sweep read (draft length)"):]


@pytest.mark.parametrize("args, message", [
    (["--oracle-draft", "2"], "needs --oracle-acceptance"),
    (["--oracle-acceptance", "1", "--oracle-draft", "8"], "choose 1..7"),
    (["--oracle-acceptance", "1", "--oracle-draft", "two"], "whole numbers"),
])
def test_oracle_draft_usage_errors_exit_2_with_one_line(prompts, capsys, args, message):
    assert _bench(["--model", "toy", "--prompts", str(prompts), "--reps", "1", "--spec-type", "none", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
