"""tsspec_bench.spread: the summary and its verdict (the runs themselves are `make bench-spread`)."""

from __future__ import annotations

from tsspec_bench import spread


def _runs(plain, ngram):
    return [{"mode": "plain", "tokens_per_second": v} for v in plain] + \
           [{"mode": "ngram", "tokens_per_second": v} for v in ngram]


def test_ngram_within_plains_spread_plus_slack():
    s = spread.summarise(_runs([100, 110, 105], [200, 230, 210]))
    assert s["plain"]["spread"] == 1.1 and s["ngram"]["spread"] == 1.15 and s["within"]


def test_a_wide_ngram_spread_is_not_within():
    s = spread.summarise(_runs([100, 110, 105], [89, 208, 200]))
    assert not s["within"]
    text = spread.markdown({"summary": s, "meta": {"date": "d", "cores": 2, "loadavg_before": "1 1 1",
                                                  "busy_loops": 2, "max_tokens": 8, "command": "c"}})
    assert "| ngram | 89.0, 208.0, 200.0 |" in text and "NOT within" in text


def test_the_load_is_started_and_stopped():
    procs = spread.start_load(1)
    assert procs[0].poll() is None
    spread.stop_load(procs)
    assert procs[0].poll() is not None


def test_each_ngram_runs_governor_decisions_are_reported():
    runs = _runs([100], [90]) + [{"mode": "ngram", "tokens_per_second": 200.0, "governor": [1, 0, 0],
                                  "verify_steps": 30, "accepted": 80}]
    runs[1].update(governor=[0, 2, 48], verify_steps=4, accepted=3)
    text = spread.markdown({"summary": spread.summarise(runs), "runs": runs,
                            "meta": {"date": "d", "cores": 2, "loadavg_before": "1 1 1", "busy_loops": 2,
                                     "max_tokens": 8, "command": "c"}})
    assert "90.0 tok/s: wins 0, losses 2, parked steps 48, 4 verifies, 3 accepted" in text
    assert "200.0 tok/s: wins 1, losses 0, parked steps 0" in text
