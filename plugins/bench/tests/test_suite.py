"""tsspec_bench.suite: the configurations and where the peers' runs fall in the schedule."""

from __future__ import annotations

import pytest

from tsspec_bench import suite
from tsspec_bench.prompts import PromptCase
from tsspec_bench.runner import CONTROL, PLAIN
from tsspec.testing import ToyTarget


def test_build_configs_puts_plain_first_and_the_control_last():
    configs = suite.build_configs(["ngram"], [0.5], None)
    assert [c.kind for c in configs] == [PLAIN, "algorithm", "oracle", CONTROL]
    assert [c.kind for c in suite.build_configs([], [], None)] == [PLAIN]  # nothing to judge
    assert [c.kind for c in suite.build_configs([], [], None, control=True)] == [PLAIN, CONTROL]  # peers


class _FakePeer:
    engine = "fake"
    chosen: dict = {}

    def describe(self):
        return {}

    def close(self):
        pass


def test_peers_run_after_tsspecs_whole_round_never_between_its_pairs(monkeypatch):
    from tsspec_bench import peers

    timeline = []
    monkeypatch.setattr(suite, "_start_peers", lambda plan, target, cases, progress, on_error: ({"fake": _FakePeer()}, {}))

    def fake_run(peer, config, case, rep, *, tsspec_tps=None, tsspec_config=None):
        timeline.append(("peer", case.id, rep, config))
        return peers.PeerRecord("fake", config, case.id, case.cls, rep, [1], 10.0, 0.1,
                                tsspec_tps=tsspec_tps, tsspec_config=tsspec_config)

    monkeypatch.setattr(peers, "run_peer_once", fake_run)

    def progress(phase, done, total, text):
        if phase == "tsspec" and done:
            case, config = text.split(":")[0].split()
            timeline.append(("tsspec", case, None, config))

    cases = [PromptCase("q1", "qa", 6, prompt="a b a b a b", chat=False)]
    plan = suite.BenchPlan("toy", None, cases, "test", algorithms=["ngram"], reps=2, compare=["fake"])
    report = suite.run_plan(plan, ToyTarget(seed=5), progress=progress)
    kinds = [event[0] for event in timeline]
    # each round: tsspec's plain, ngram and control back to back, then both peer runs
    assert kinds == ["tsspec"] * 3 + ["peer"] * 2 + ["tsspec"] * 3 + ["peer"] * 2 + ["tsspec"] * 3 + ["peer"] * 2
    peer_order = [e[3] for e in timeline if e[0] == "peer" and e[2] >= 0]
    assert peer_order == ["plain", "prompt-lookup", "prompt-lookup", "plain"]  # alternated too
    lookup = [r for r in report.peer_records if r.config == "prompt-lookup"]
    assert all(r.tsspec_config == "ngram" for r in lookup)  # paired with tsspec's run of its round
    assert all(r.tsspec_config == "plain" for r in report.peer_records if r.config == "plain")


