"""The no-compiler fallback, run for real: fresh processes with ``TSSPEC_NATIVE=0`` load the
embedded model on dense torch weights, say so on stderr, and stay lossless (greedy and seeded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tsspec_gguf import native

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"


def generate(*args: str, native_on: bool = False) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TS_SPEC_", "TS_MTP_", "TSSPEC_"))}
    if not native_on:
        env["TSSPEC_NATIVE"] = "0"
    cmd = [sys.executable, "-m", "tsspec.cli.app", "generate", "--prompt", PROMPT, "-n", "20", "--json", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_forced_off_is_read_from_the_environment():
    assert native.forced_off({"TSSPEC_NATIVE": "0"})
    assert not native.forced_off({"TSSPEC_NATIVE": "1"})


@pytest.mark.parametrize("sampling", [(), ("--temperature", "0.8", "--top-p", "0.95", "--seed", "3")],
                         ids=["greedy", "seeded"])
def test_dense_fallback_is_lossless_and_not_silent(sampling):
    plain, err = generate("--no-spec", *sampling)
    spec, _ = generate("--spec-type", "ngram", "--no-spec-adaptive", *sampling)
    assert "runs dense float32 torch matmuls (TSSPEC_NATIVE=0" in err
    assert spec["stats"]["verify_steps"] > 0
    assert spec["tokens"] == plain["tokens"]


@pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels were not built")
def test_the_kernels_path_warns_nothing():
    _, err = generate("--no-spec", native_on=True)
    assert "warning" not in err
