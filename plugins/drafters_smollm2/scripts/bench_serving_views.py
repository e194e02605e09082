"""Figures: the shipped MTP drafter serving several sequences at once, one shared head vs a view
of it per sequence (``DraftHead.for_sequence``).

The engine the server runs (the core's ``Scheduler``, requests submitted in-process as
``tsspec bench-serve`` does) serves N chat requests at once (N = 2, 4) with ``draft-head`` and
the shipped drafter. Modes, alternating in every repetition, each run on a fresh scheduler:

- ``shared``: the head with ``for_sequence`` hidden, so every sequence's speculator drives the
  one head (the behaviour before views: each catch-up of one sequence drops the others');
- ``views``: each speculator drafts on its own view (this plugin's default);
- ``plain``: no speculation (the reference the outputs are checked against).

``--reuse`` measures the other thing a busy server does to a learned drafter: the same chats
sent one after the other to one scheduler, each with the model's default system prompt (one
user message), so every chat after the first adopts the cached block of that prompt. Modes
``before`` (the head says ``resumes_after_gap = False``, as NextN files did: draft-head does
not arm after a reused prefix) and ``after`` (this plugin's default), alternating.

Per request: accepted / drafted and tokens per verify (summed over the request's runs, then
per request); per mode: aggregate tok/s (all tokens over the wall time from submission to the
last token, prefill included) and the process's CPU milliseconds per token (steadier than wall
time on a machine shared with other work), medians over the repetitions, and the views /
shared ratio.

    python plugins/drafters_smollm2/scripts/bench_serving_views.py --reps 3 --max-tokens 48
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from importlib import resources

from tsspec_serve.scheduler import Scheduler, SequenceRequest
from tsspec_gguf.embedded import embedded_model_path
from tsspec.runtime.defaults import default_catalog
from tsspec.runtime.loading import load_model
from tsspec.runtime.options import SpeculationOptions

MODES = ("shared", "views", "plain")
CLASSES = ("chat", "prose", "qa", "math")  # the first benchmark prompt of each, one per stream


def prompts(target) -> list[list[int]]:
    text = resources.files("tsspec_bench").joinpath("data/prompts/bench.jsonl").read_text("utf-8")
    first: dict[str, list] = {}
    for line in text.splitlines():
        if line.strip():
            row = json.loads(line)
            first.setdefault(row["class"], row["messages"])
    tok = target.tokenizer
    return [tok.encode(tok.apply_chat_template(first[c], add_generation_prompt=True), add_special_tokens=False)
            for c in CLASSES]


def user_prompts(target) -> list[list[int]]:
    """The last user message of the same benchmark prompts, alone: the default system prompt."""
    text = resources.files("tsspec_bench").joinpath("data/prompts/bench.jsonl").read_text("utf-8")
    first: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip():
            row = json.loads(line)
            users = [m["content"] for m in row["messages"] if m["role"] == "user"]
            first.setdefault(row["class"], users[-1])
    tok = target.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": first[c]}], add_generation_prompt=True),
                       add_special_tokens=False) for c in CLASSES]


def run_sequential(target, registry, ids: list[list[int]], mode: str, max_tokens: int, adaptive: bool) -> dict:
    head = target.draft_head
    if mode == "before":
        head.resumes_after_gap = False  # the instance attribute hides the class's True
    options = SpeculationOptions(spec_type="draft-head", adaptive=adaptive)
    sched = Scheduler(target, kv_cache_mb=256, max_seqs=8, registry=registry).start()
    try:
        start = time.perf_counter()
        results = []
        for p in ids:
            handle = sched.submit_request(SequenceRequest(p, max_tokens, options=options))
            handle.wait()
            results.append(handle.result)
        wall = time.perf_counter() - start
    finally:
        sched.close()
        head.__dict__.pop("resumes_after_gap", None)
    return {"tok_s": sum(len(r.tokens) for r in results) / wall, "tokens": [list(r.tokens) for r in results],
            "requests": [{"drafted": r.stats.draft_tokens, "accepted": r.stats.accepted_tokens,
                          "verifies": r.stats.verify_steps, "reused": r.stats.prefix_reused,
                          "armed": r.stats.armed_after_reuse} for r in results]}


def reuse_main(target, registry, args) -> int:
    ids = user_prompts(target)
    runs: dict[str, list] = {"before": [], "after": []}
    for rep in range(args.reps):
        for mode in (("before", "after") if rep % 2 == 0 else ("after", "before")):
            runs[mode].append(run_sequential(target, registry, ids, mode, args.max_tokens, not args.no_governor))
    if any(r["tokens"] != runs["before"][0]["tokens"] for m in runs for r in runs[m]):
        raise RuntimeError("the outputs differ between runs: not lossless")
    lines = ["| request | prefix reused | before: armed, accepted/drafted, tok/verify | after: armed, accepted/drafted, tok/verify |",
             "|---|---:|---|---|"]
    for i, name in enumerate(CLASSES):
        cells = []
        for mode in ("before", "after"):
            parts = [r["requests"][i] for r in runs[mode]]
            drafted, accepted = sum(p["drafted"] for p in parts), sum(p["accepted"] for p in parts)
            verifies = sum(p["verifies"] for p in parts)
            armed = parts[0]["armed"] if parts[0]["reused"] else "-"
            cells.append(f"{armed}, {accepted}/{drafted}, {(accepted + verifies) / verifies if verifies else 0.0:.2f}")
        lines.append(f"| {name} | {runs['after'][0]['requests'][i]['reused']} | {cells[0]} | {cells[1]} |")
    med = {m: statistics.median(r["tok_s"] for r in runs[m]) for m in runs}
    lines += ["", f"tok/s over the {len(ids)} chats (medians of {args.reps}): before {med['before']:.1f}, "
              f"after {med['after']:.1f} ({med['after'] / med['before']:.2f}x); runs: "
              + "; ".join(f"{m} " + ", ".join(f"{r['tok_s']:.1f}" for r in runs[m]) for m in runs)]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(runs, handle, indent=1)
    return 0


def run(target, registry, ids: list[list[int]], mode: str, max_tokens: int, adaptive: bool) -> dict:
    head = target.draft_head
    if mode == "shared":
        head.for_sequence = None  # the factory finds no callable member: one head for all
    options = (SpeculationOptions(enabled=False) if mode == "plain"
               else SpeculationOptions(spec_type="draft-head", adaptive=adaptive))
    sched = Scheduler(target, kv_cache_mb=256, max_seqs=8, registry=registry).start()
    try:
        start, cpu = time.perf_counter(), time.process_time()
        handles = [sched.submit_request(SequenceRequest(p, max_tokens, options=options)) for p in ids]
        for h in handles:
            h.wait()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        sched.close()
        head.__dict__.pop("for_sequence", None)
    results = [h.result for h in handles]
    tokens = sum(len(r.tokens) for r in results)
    return {"tok_s": tokens / wall, "cpu_ms_per_token": 1000.0 * cpu / tokens,
            "tokens": [list(r.tokens) for r in results],
            "requests": [{"drafted": r.stats.draft_tokens, "accepted": r.stats.accepted_tokens,
                          "verifies": r.stats.verify_steps, "reused": r.stats.prefix_reused,
                          "parked_steps": r.stats.governor_parked_steps} for r in results]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", default="2,4")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--no-governor", action="store_true", help="adaptive=False (acceptance without parks)")
    ap.add_argument("--reuse", action="store_true", help="sequential chats sharing the system prompt's cached block")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    catalog = default_catalog()
    target = load_model(embedded_model_path(), catalog=catalog, options=SpeculationOptions(spec_type="draft-head"))
    if not callable(getattr(target.draft_head, "for_sequence", None)):
        print("the shipped MTP drafter was not attached (is tsspec-drafters-smollm2 installed?)", file=sys.stderr)
        return 2
    if args.reuse:
        run_sequential(target, catalog.speculators, user_prompts(target)[:1], "after", 8, True)  # warm-up
        return reuse_main(target, catalog.speculators, args)
    ids = prompts(target)
    run(target, catalog.speculators, ids[:2], "views", 8, True)  # warm-up (allocations, first calls): not counted
    report = {"streams": [], "adaptive": not args.no_governor, "max_tokens": args.max_tokens, "reps": args.reps}
    lines = ["| streams | request | shared accepted/drafted | shared tok/verify | views accepted/drafted | "
             "views tok/verify |", "|---:|---|---:|---:|---:|---:|"]
    totals = ["| streams | shared tok/s | views tok/s | plain tok/s | views / shared | views / plain | "
              "CPU ms/token shared / views / plain |", "|---:|---:|---:|---:|---:|---:|---|"]
    for n in (int(s) for s in args.streams.split(",")):
        runs: dict[str, list] = {m: [] for m in MODES}
        for rep in range(args.reps):
            order = MODES if rep % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                runs[mode].append(run(target, catalog.speculators, ids[:n], mode, args.max_tokens, not args.no_governor))
        reference = runs["plain"][0]["tokens"]
        for mode in MODES:
            for r in runs[mode]:
                if r["tokens"] != reference:
                    raise RuntimeError(f"{mode} with {n} streams differs from plain decoding: not lossless")
        med = {m: statistics.median(r["tok_s"] for r in runs[m]) for m in MODES}
        cpu = {m: statistics.median(r["cpu_ms_per_token"] for r in runs[m]) for m in MODES}
        per_request = []
        for i in range(n):
            row = {"request": CLASSES[i]}
            for mode in ("shared", "views"):
                parts = [r["requests"][i] for r in runs[mode]]
                drafted, accepted = sum(p["drafted"] for p in parts), sum(p["accepted"] for p in parts)
                verifies = sum(p["verifies"] for p in parts)
                row[mode] = {"drafted": drafted, "accepted": accepted, "verifies": verifies,
                             "tokens_per_verify": (accepted + verifies) / verifies if verifies else 0.0,
                             "reused": [p["reused"] for p in parts], "parked_steps": [p["parked_steps"] for p in parts]}
            per_request.append(row)
            s, v = row["shared"], row["views"]
            lines.append(f"| {n} | {row['request']} | {s['accepted']}/{s['drafted']} | {s['tokens_per_verify']:.2f} | "
                         f"{v['accepted']}/{v['drafted']} | {v['tokens_per_verify']:.2f} |")
        totals.append(f"| {n} | {med['shared']:.1f} | {med['views']:.1f} | {med['plain']:.1f} | "
                      f"{med['views'] / med['shared']:.2f}x | {med['views'] / med['plain']:.2f}x | "
                      f"{cpu['shared']:.1f} / {cpu['views']:.1f} / {cpu['plain']:.1f} |")
        report["streams"].append({"streams": n, "tok_s": med, "cpu_ms_per_token": cpu, "tok_s_runs": {m: [r["tok_s"] for r in runs[m]] for m in MODES},
                                  "requests": per_request})
        print(f"[{n} streams] tok/s shared {med['shared']:.1f}, views {med['views']:.1f}, plain {med['plain']:.1f}",
              file=sys.stderr)
    print("\n".join(lines + [""] + totals))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
