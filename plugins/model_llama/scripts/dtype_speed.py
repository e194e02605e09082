"""Plain decode speed of the embedded model by --dtype: fresh `tsspec generate --no-spec --json`
processes, the dtypes alternating (the order flips every round), tok/s as each run printed.

    python plugins/model_llama/scripts/dtype_speed.py [--rounds 3] [--dtypes default,bfloat16] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def run(dtype: str, tokens: int) -> float:
    cmd = [sys.executable, "-m", "tsspec.cli.app", "generate", "--chat", "-p", PROMPT, "-n", str(tokens),
           "--no-spec", "--json", *([] if dtype == "default" else ["--dtype", dtype])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"dtype_speed: {dtype} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["stats"]["tokens_per_second"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dtypes", default="default,bfloat16")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    dtypes = args.dtypes.split(",")
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    runs: dict[str, list[float]] = {d: [] for d in dtypes}
    for i in range(args.rounds):
        for d in dtypes if i % 2 == 0 else reversed(dtypes):
            runs[d].append(run(d, args.tokens))
            print(f"dtype_speed: round {i + 1} {d}: {runs[d][-1]:.1f} tok/s", flush=True)
    lines = [f"Plain decode of the embedded model by `--dtype`, {args.tokens} tokens, fresh processes, "
             f"alternating; {started}, load average before {load}; command: "
             f"`python plugins/model_llama/scripts/dtype_speed.py {' '.join(argv or sys.argv[1:])}`", "",
             "| dtype | tok/s per run | median |", "| --- | --- | --- |"]
    for d in dtypes:
        lines.append(f"| {d} | {', '.join(f'{v:.1f}' for v in runs[d])} | {statistics.median(runs[d]):.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
