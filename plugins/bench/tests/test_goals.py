"""tsspec_bench.goals: the CPU speed goals measured in one bench run, peers interleaved.

The toy target stands in for the model and a stand-in llama_cpp package (test_bench_peers) for
the engine, with the goals' sizes shrunk: this checks the plumbing (pairing, goal rows, report),
never a speed."""

from __future__ import annotations

import json

import pytest

from tsspec_bench import goals
from tsspec_bench.prompts import load_prompt_set
from tsspec_bench.suite import BenchPlan, run_plan
from tsspec.runtime.loading import load_model


@pytest.fixture
def cases(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"id": "q1", "class": "qa", "prompt": "the cat sat on the mat. the cat sat on the", "max_tokens": 8},
        {"id": "w1", "class": "chat", "prompt": "hello there, how are you today my friend", "max_tokens": 8},
    ]) + "\n")
    return load_prompt_set(path)


def test_goals_and_paired_peers_in_one_run(monkeypatch, cases, fake_llama_env):
    env, model = fake_llama_env
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # tsspec's own environment: must not reach the peer
    monkeypatch.setattr(goals, "PREFILL_TOKENS", 40)
    monkeypatch.setattr(goals, "VERIFY_CONTEXT", 20)
    monkeypatch.setattr(goals.verify_cost, "__kwdefaults__", {"context": 20, "rows": 9, "reps": 2})
    monkeypatch.setattr(goals.prefill_pairs, "__kwdefaults__", {"reps": 1, "progress": None})
    from tsspec_bench import physics

    monkeypatch.setattr(physics, "BANDWIDTH_MIB", 4)
    monkeypatch.setattr(physics, "MATMUL_SIZE", 64)
    target = load_model("toy")
    from tsspec.runtime import loading

    second_loads = []

    def load_second(path, **kwargs):  # the fake GGUF has no model: the second target is a toy too
        second_loads.append(kwargs["dtype"])
        return load_model("toy")

    monkeypatch.setattr(loading, "load_model", load_second)
    plan = BenchPlan(model_name="toy", model_path=str(model), cases=cases, prompts_label="test",
                     algorithms=["ngram"], reps=1, compare=["llama.cpp"], compare_reps=1, peer_reps={"llama.cpp": 1},
                     goals=True)
    report = run_plan(plan, target)
    assert not report.peer_errors
    peer_info = report.meta["settings"]["peers"]["llama.cpp"]
    assert peer_info["environment"] == {} and len(peer_info["probe"]) == 13
    assert report.meta["settings"]["peer_reps"] == {"llama.cpp": 1}
    timed = [r for r in report.peer_records if r.rep >= 0]
    # each case: llama.cpp plain right after tsspec plain, prompt lookup right after ngram
    assert [(r.case_id, r.config, r.tsspec_config) for r in timed] == [
        ("q1", "plain", "plain"), ("q1", "prompt-lookup", "ngram"),
        ("w1", "plain", "plain"), ("w1", "prompt-lookup", "ngram")]
    assert all(r.tsspec_tps and r.variant for r in timed)
    rows = report.goal_rows()
    assert [g.number for g in rows] == [1, 1, 2, 2, 3, 3, 4]
    assert rows[0].ratio is not None and rows[0].met in (True, False)  # measured on the toy
    # goal 1 again on the second (int8) target: its own 1-row and 9-row forwards
    assert rows[1].name == "verify cost by rows with --dtype int8" and rows[1].ratio is not None
    v2 = report.goals["verify_second"]
    assert v2["dtype"] == "int8" and v2["rows"] == 9 and v2["one_row_ms"] > 0 and v2["ratio"] == rows[1].ratio
    rows = rows[:1] + rows[2:]  # the rest as without the second goal-1 row
    assert rows[1].ratio is not None and rows[5].ratio is not None
    # the int8 row: a second target's plain run after each llama.cpp plain run (warm-up included)
    assert second_loads == ["int8"]
    second = report.goals["second_precision"]
    assert second["dtype"] == "int8" and second["pairs"] == 2 and len(second["runs"]) == 3
    assert [r["case"] for r in second["runs"]] == ["q1", "q1", "w1"]
    assert second["same_as_reference"] == 2  # the toy's output is its own plain output
    assert second["same_as_peer"] == 0  # the stand-in engine emits 11, 12, ...
    assert rows[2].name == "plain decode with --dtype int8 vs llama.cpp" and "output = llama.cpp's in 0/2" in rows[2].figure
    markdown = report.to_markdown()
    assert "## The CPU speed goals" in markdown and "verify cost by rows" in markdown
    # the probe table names every probed variant and marks the ones used
    assert "1 paired round per prompt; the probe took" in markdown and peer_info["probe_seconds"] > 0
    assert "| llama.cpp | draft length | `prompt-lookup/generate/fa0/n3` |" in markdown
    assert f"| `{peer_info['chosen']['prompt-lookup']}` |" in markdown and "| used |" in markdown
    # the physical picture: the machine's figures and the floors, measured in this run
    physics = report.goals["physics"]
    assert physics["weight_bytes"] > 0 and physics["stream_ms"] > 0 and physics["ratio_floor"] >= 1.0
    assert physics["one_row_ms"] == report.goals["verify"]["one_row_ms"]
    assert "### The physical picture (measured in this run)" in markdown
    assert "Lower bound of the 9-row / 1-row ratio" in markdown
    section = markdown[markdown.index("### The physical picture"):markdown.index("Prefill, llama.cpp")]
    assert "{" not in section and "a 9-row verify does" in section  # every figure formatted
    assert "- Plain decoding in this run: a one-row step takes" in section
    from tsspec_gguf import native

    # the int8 probe runs only in the probes build (TSSPEC_BUILD_PROBES=1): then its floor and goal 1 in int8
    if native.probes() is not None and str(native.info().get("simd") or "").startswith("avx2"):
        assert physics["ratio_floor_int8"] >= 1.0 and physics["int8_ops"] > 0
        assert "- int8 multiply-add peak" in section and "measured with --dtype int8: 1 row" in section
    data = report.to_json()
    assert len(data["goals"]["rows"]) == 7 and data["goals"]["measured"]["prefill"]["tokens"] == 40


def test_verify_cost_is_timed_by_the_shared_row_measurer():
    """Goal 1's ratio comes from tsspec_gguf.row_timing: paired per round, never below 1."""
    target = load_model("toy")
    out = goals.verify_cost(target, list(range(3, 40)), context=20, rows=9, reps=3)
    assert out["context"] == 20 and out["rows"] == 9 and out["reps"] == 3 and out["ratio"] >= 1.0
    assert out["rows_ms"] == pytest.approx(out["one_row_ms"] * out["ratio"])
    assert target.cache_seq_len == 0  # left as a fresh sequence
