"""scripts/device_check.py end to end as a dry run on the CPU (the torch contracts standing in for
the kernels, tiny sizes): it measures everything and writes one JSON and one markdown report."""

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
    assert proc.returncode in (0, 1), proc.stderr  # 1: a CPU misses the GPU timing targets
    report = json.loads((tmp_path / "device_report.json").read_text())
    assert max(report["correctness"].values()) == 0.0  # the contracts against themselves
    assert set(report["timings"]) == {"gdn_verify", "gdn_commit", "dflash_inject", "dflash_block_attention",
                                      "dflash_grouped_conv", "selector_lattice"}
    assert all(row["floor_ms"] > 0 and row["kernel_ms"] > 0 for row in report["timings"].values())
    assert report["dflash_block"]["kernels_in_use"] and report["dflash_block"]["torch_in_use"] == []
    assert "every kernel == torch contract within 1e-5 (float32)" in report["verdicts"]
    rollback = report["rollback"]  # measured: slots commit without re-forwarding, restore does not
    assert rollback["kernels"]["reforwards"] == 0 and "gdn_commit" in rollback["kernels"]["in_use"]
    assert rollback["torch_reforward"]["reforwards"] > 0
    text = (tmp_path / "device_report.md").read_text()
    assert text.startswith("# kernels_cuda device check") and "| gdn_verify |" in text


def test_shell_script_installs_without_dependencies():
    script = (ROOT / "kernels_cuda/scripts/device_check.sh").read_text()
    assert "--no-deps" in script and "PIP_NO_INDEX=1" in script and "torch==" not in script
    assert "-e kernels_cuda" in script and "device_check.py" in script
