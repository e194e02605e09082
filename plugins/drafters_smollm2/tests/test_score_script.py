"""scripts/score_drafter.py: the gate-confidence buckets of first drafts, and the script's
first-draft figures on the shipped file agree with the trainer's teacher-forced accuracy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parents[1] / "scripts" / "score_drafter.py"


@pytest.fixture(scope="module")
def score():
    spec = importlib.util.spec_from_file_location("score_drafter_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_calibration_buckets_count_shares_and_landing(score):
    conf = torch.tensor([0.1, 0.2, 0.35, 0.95, 0.99, 1.0])
    hit = torch.tensor([False, True, False, True, True, False])
    rows = {r["bucket"]: r for r in score.calibration(conf, hit)}
    assert rows["0.0-0.3"]["tokens"] == 2 and rows["0.0-0.3"]["lands"] == pytest.approx(0.5)
    assert rows["0.3-0.5"]["share"] == pytest.approx(1 / 6) and rows["0.3-0.5"]["lands"] == 0.0
    assert rows["0.5-0.7"]["lands"] is None and rows["0.5-0.7"]["tokens"] == 0
    assert rows["0.9-1.0"]["tokens"] == 3 and rows["0.9-1.0"]["lands"] == pytest.approx(2 / 3)  # 1.0 included
    assert sum(r["tokens"] for r in rows.values()) == conf.numel()


def test_gate_shares_are_what_passes_and_lands(score):
    conf = torch.tensor([0.1, 0.4, 0.6, 0.8])
    hit = torch.tensor([True, False, True, True])
    rows = {r["pmin"]: r for r in score.at_gates(conf, hit, gates=(0.3, 0.7, 0.9))}
    assert rows[0.3]["passes"] == pytest.approx(0.75) and rows[0.3]["lands"] == pytest.approx(2 / 3)
    assert rows[0.3]["landed_per_token"] == pytest.approx(0.5)  # the hit at 0.1 never passed
    assert rows[0.7]["passes"] == pytest.approx(0.25) and rows[0.7]["lands"] == 1.0
    assert rows[0.9]["passes"] == 0.0 and rows[0.9]["lands"] is None


def test_first_drafts_agree_with_the_trainers_answer_accuracy(score):
    from tsspec_draft_head.nextn_model import NextNConfig, NextNModule
    from tsspec_draft_head.trainer import _Batches, answer_accuracy
    from tsspec_training.teacher import TeacherSequence

    V, H = 40, 16
    cfg = NextNConfig(hidden_size=H, intermediate_size=24, num_heads=2, num_kv_heads=2, head_dim=8,
                      rope_theta=10000.0, rms_eps=1e-5, draft_vocab=12)
    torch.manual_seed(0)
    module = NextNModule(cfg, V)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        module.draft_ids.copy_(torch.arange(12))
    g = torch.Generator().manual_seed(1)
    data = [TeacherSequence(source="held-out", tokens=torch.randint(V, (20,), generator=g),
                            hidden=torch.randn(20, H, generator=g).half(), labels=torch.randint(12, (20,), generator=g),
                            answer_start=6) for _ in range(3)]
    batches = _Batches(data, torch.randn(V, H, generator=g), module.draft_ids, V, 1, torch.device("cpu"))
    conf, hit = score.first_drafts(module, batches, data)
    assert conf.shape == hit.shape == (3 * 14,) and bool(((conf > 0) & (conf <= 1)).all())
    assert hit.float().mean().item() == pytest.approx(answer_accuracy(module, batches, data, 1)["acc1"])
