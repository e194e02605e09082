"""Fresh-process spread under a defined competing load: is ngram's speed as repeatable as plain's?

Each run is a fresh ``tsspec generate --json`` process (its own row-cost check, its own governor),
on one prompt, while one busy-loop process per usable core competes for the CPU (the defined
load). Plain and ngram runs alternate (the order flips every round, so drift favours neither).
The report gives each mode's tok/s per run, its median and its max/min spread; the question is
whether ngram's spread stays within plain's spread plus 10 percentage points.

    python -m tsspec_bench.spread [--runs 6] [--markdown FILE] [-- extra generate flags]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = ("Rewrite this function so it also skips negative numbers, keeping everything else the same:\n"
          "def total(xs):\n    s = 0\n    for x in xs:\n        s += x\n    return s\n")
MODES = {"plain": ["--no-spec"], "ngram": ["--spec-type", "ngram"]}
SLACK = 0.10  # ngram's max/min spread may exceed plain's by this much (as a ratio)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def start_load(n: int) -> list[subprocess.Popen]:
    """``n`` busy-loop processes (pure Python spin, no I/O): the competing load."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


def run_once(mode: str, max_tokens: int, extra: list[str]) -> dict:
    """One fresh process: tok/s, tokens emitted, and what ran."""
    cmd = [sys.executable, "-m", "tsspec.cli.app", "generate", "--chat", "-p", PROMPT, "-n", str(max_tokens),
           "--json", *MODES[mode], *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"spread: {mode} run failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    stats = data["stats"]
    return {"mode": mode, "tokens_per_second": float(stats["tokens_per_second"]),
            "emitted": len(data["tokens"]), "speculator": data.get("speculator") or "plain",
            "governor": [int(stats.get(k, 0)) for k in ("governor_wins", "governor_losses", "governor_parked_steps")],
            "verify_steps": int(stats.get("verify_steps", 0)), "accepted": int(stats.get("accepted_tokens", 0))}


def decisions(runs: list[dict]) -> str:
    """Each ngram run's governor decisions, in run order.

    >>> decisions([{"mode": "ngram", "tokens_per_second": 9.5, "governor": [1, 0, 0], "verify_steps": 30,
    ...             "accepted": 70}, {"mode": "plain", "tokens_per_second": 6.0}])
    '9.5 tok/s: wins 1, losses 0, parked steps 0, 30 verifies, 70 accepted'
    """
    return "; ".join(f"{r['tokens_per_second']:.1f} tok/s: wins {r['governor'][0]}, losses {r['governor'][1]}, "
                     f"parked steps {r['governor'][2]}, {r['verify_steps']} verifies, {r['accepted']} accepted"
                     for r in runs if r["mode"] == "ngram" and "governor" in r)


def spread(values: list[float]) -> float:
    """max / min.

    >>> spread([100.0, 120.0, 110.0])
    1.2
    """
    return max(values) / min(values)


def summarise(runs: list[dict]) -> dict:
    out = {}
    for mode in MODES:
        tps = [r["tokens_per_second"] for r in runs if r["mode"] == mode]
        if tps:
            out[mode] = {"runs": tps, "median": statistics.median(tps), "min": min(tps), "max": max(tps),
                         "spread": spread(tps)}
    if "plain" in out and "ngram" in out:
        out["within"] = out["ngram"]["spread"] <= out["plain"]["spread"] + SLACK
    return out


def markdown(result: dict) -> str:
    s, m = result["summary"], result["meta"]
    lines = ["# Fresh-process spread under a competing load", "",
             f"Run {m['date']} on {m['cores']} usable cores, load average before the run {m['loadavg_before']}, "
             f"competing load: {m['busy_loops']} busy-loop processes (one per usable core); "
             f"command: `{m['command']}`.", "",
             f"Each run is a fresh `tsspec generate --json` process on one prompt ({m['max_tokens']} tokens), "
             "plain and ngram alternating (the order flips every round). Figures are what the runs printed.", "",
             "| mode | tok/s per run | median | min | max | max/min |", "| --- | --- | --- | --- | --- | --- |"]
    for mode in MODES:
        if mode in s:
            c = s[mode]
            lines.append(f"| {mode} | {', '.join(f'{v:.1f}' for v in c['runs'])} | {c['median']:.1f} | {c['min']:.1f} "
                         f"| {c['max']:.1f} | {c['spread']:.2f} |")
    if any("governor" in r for r in result.get("runs", [])):
        lines += ["", "The cost governor in each ngram run (as its `--json` stats printed): "
                  + decisions(result["runs"]) + "."]
    if "within" in s:
        lines += ["", f"ngram's spread {s['ngram']['spread']:.2f} vs plain's {s['plain']['spread']:.2f} + {SLACK:.2f}: "
                  + ("within" if s["within"] else "NOT within") + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="fresh processes per mode")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--busy", type=int, default=None, help="busy-loop processes (default: one per usable core)")
    parser.add_argument("--markdown", help="write the report here")
    parser.add_argument("--json", dest="json_path", help="write the runs here")
    parser.add_argument("extra", nargs="*", help="extra `tsspec generate` flags (after --)")
    args = parser.parse_args(argv)
    busy = cores() if args.busy is None else args.busy
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cores": cores(),
            "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()), "busy_loops": busy,
            "max_tokens": args.max_tokens, "command": " ".join(["python -m tsspec_bench.spread", *(argv or sys.argv[1:])])}
    load = start_load(busy)
    runs: list[dict] = []
    try:
        time.sleep(1.0)  # the load is running before the first run starts
        for i in range(args.runs):
            for mode in (("plain", "ngram") if i % 2 == 0 else ("ngram", "plain")):
                runs.append(run_once(mode, args.max_tokens, args.extra))
                print(f"spread: run {i + 1}/{args.runs} {mode}: {runs[-1]['tokens_per_second']:.1f} tok/s", flush=True)
    finally:
        stop_load(load)
    result = {"meta": meta, "runs": runs, "summary": summarise(runs)}
    text = markdown(result)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
