"""scripts/device_check.py end to end as a dry run on the CPU (the torch contracts standing in for
the kernels, tiny sizes): it checks the contracts against the float64 equations, measures
everything, labels itself a dry run, and records what it skipped as NOT RUN, never PASS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_writes_the_report(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "kernels_cuda/scripts/device_check.py"), "--out", str(tmp_path),
                           "--sizes", "tiny", "--device", "cpu", "--skip-tests"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads((tmp_path / "device_report.json").read_text())
    assert report["dry_run"] is True
    assert 0.0 < max(report["correctness"].values()) <= 1e-5  # float32 contracts vs float64 equations
    assert set(report["timings"]) == {"gdn_verify", "gdn_commit", "dflash_inject", "dflash_block_attention",
                                      "dflash_grouped_conv", "selector_lattice"}
    assert all(row["floor_ms"] > 0 and row["kernel_ms"] > 0 for row in report["timings"].values())
    assert report["dflash_block"]["kernels_in_use"] and report["dflash_block"]["torch_in_use"] == []
    verdicts = report["verdicts"]
    assert verdicts["every torch contract (dry run: no kernel) within 1e-5 of the float64 equations"] == "PASS"
    assert verdicts["lossless tests pass on the device"] == "NOT RUN: not run (--skip-tests)"
    assert verdicts["fused GDN verify within 2x its bytes floor"].startswith("NOT RUN: dry run")
    assert verdicts["DFlash block (inject + draft) under 20% of a target decode step"].startswith("NOT RUN: dry run")
    assert all(v == "PASS" or v.startswith("NOT RUN") for v in verdicts.values())
    rollback = report["rollback"]  # measured: slots commit without re-forwarding, restore does not
    assert rollback["kernels"]["reforwards"] == 0 and "gdn_commit" in rollback["kernels"]["in_use"]
    assert rollback["torch_reforward"]["reforwards"] > 0
    text = (tmp_path / "device_report.md").read_text()
    assert text.startswith("# kernels_cuda device check: DRY RUN on the CPU") and "| gdn_verify |" in text
    assert "- NOT RUN: " in text and "- PASS: lossless" not in text


def test_shell_script_installs_without_dependencies():
    script = (ROOT / "kernels_cuda/scripts/device_check.sh").read_text()
    assert "--no-deps" in script and "PIP_NO_INDEX=1" in script and "torch==" not in script
    assert "-e kernels_cuda" in script and "device_check.py" in script
