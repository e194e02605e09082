"""Per-row state snapshots against restore + re-forward on a mid-size random qwen35 (CPU).

What it measures, with the shared loop and ``tsspec.testing.OracleSpeculator`` (the plain
continuation, each drafted token corrupted with probability 1 - acceptance), window 3:

* decode tok/s of the per-row-snapshot path over the restore + re-forward path, per acceptance;
* rollback ms per verify step (the loop's ``rollback`` phase: a slot commit vs restore + a
  second forward of the kept rows) and snapshot ms (nothing vs a copy of the recurrent state);
* the snapshot overhead on the verify itself: the same 4-row verify with slots emitted vs with
  the live state advanced in place, timed directly on the target.

Runs are paired and alternate order (A B, B A, ...), one model in memory shared by both paths
(``target.per_row_snapshots`` flips between runs); figures are medians; every run's tokens are
checked against plain decoding. Usage::

    python plugins/model_qwen35/scripts/bench_snapshots.py [--reps 5] [--tokens 48] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import attrs
import torch

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.testing import OracleSpeculator

from tsspec_model_qwen35.loader import load_from_source
from tsspec_model_qwen35.source import MemorySource
from tsspec_model_qwen35.synthetic import SyntheticSpec, parameter_count, random_model

ACCEPTANCES = (0.3, 0.6, 0.9)
WINDOW = 3
PROMPT_TOKENS = 48
VERIFY_ROWS = WINDOW + 1


def build(args):
    spec = SyntheticSpec(hidden_size=args.hidden, num_layers=args.layers, vocab_size=args.vocab)
    arch, meta, tensors = random_model(spec, seed=0)
    params = parameter_count(tensors)
    target = load_from_source(MemorySource(arch, meta, tensors), with_draft_head=False)
    del tensors
    return target, spec, params


def run_once(target, prompt, reference, acceptance, per_row, tokens, seed):
    target.per_row_snapshots = per_row
    speculator = OracleSpeculator(reference, corrupt=1.0 - acceptance, vocab_size=target.config.vocab_size,
                                  max_draft_tokens=WINDOW, seed=seed)
    out = generate(target, prompt, SpeculationOptions(draft=WINDOW, adaptive=False), max_tokens=tokens,
                   speculator=speculator)
    if out.tokens != reference[len(prompt):]:
        raise SystemExit(f"LOSSLESS VIOLATION at acceptance {acceptance}, per_row={per_row}")
    s = out.stats
    steps = max(s.verify_steps, 1)
    return {
        "tok_s": s.tokens_per_second,
        "rollback_ms": s.phase_ms["rollback"] / steps,
        "snapshot_ms": s.phase_ms["snapshot"] / steps,
        "verify_ms": s.phase_ms["verify"] / steps,
        "acceptance": s.acceptance_rate,
        "modes": dict(s.rollback_modes),
    }


def verify_overhead(target, prompt, reps):
    """Median ms of one 4-row verify emitting per-row slots vs advancing the live state in place,
    alternating on the identical state (restored, untimed, after each)."""
    rows = prompt[:VERIFY_ROWS]
    target.per_row_snapshots = False
    target.spec_rewind_cache(0)
    target.spec_ensure_capacity(len(prompt) + VERIFY_ROWS)
    target.spec_forward(prompt, all_logits_rows=False, want_hidden=False)
    target.spec_keep(len(prompt))
    start = target.cache_seq_len
    timings = {True: [], False: []}
    for i in range(2 * reps + 2):  # the first pair warms up
        per_row = (i % 2 == 0) != ((i // 2) % 2 == 1)  # pairs alternate their order
        target.per_row_snapshots = per_row
        t0 = time.perf_counter()  # the restore path's verify includes its state copy
        target.spec_forward(rows, all_logits_rows=True, want_hidden=False)
        if i >= 2:
            timings[per_row].append((time.perf_counter() - t0) * 1000.0)
        target.spec_rewind_cache(start)  # drops the unresolved verify: back to the saved state
    return statistics.median(timings[True]), statistics.median(timings[False])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5, help="paired runs per acceptance")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target, spec, params = build(args)
    print(f"model: random qwen35, {spec.num_layers} layers (GDN every layer but each "
          f"{spec.full_attention_interval}th), hidden {spec.hidden_size}, {params / 1e6:.0f}M params, "
          f"torch threads {torch.get_num_threads()}")
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, spec.vocab_size, (PROMPT_TOKENS,), generator=g).tolist()
    target.per_row_snapshots = True
    plain = generate(target, prompt, SpeculationOptions(enabled=False), max_tokens=args.tokens)
    reference = prompt + plain.tokens
    print(f"plain decode: {plain.stats.tokens_per_second:.2f} tok/s")
    results = {"model": attrs.asdict(spec), "params": params, "plain_tok_s": plain.stats.tokens_per_second,
               "acceptance": {}}
    for acceptance in ACCEPTANCES:
        runs = {True: [], False: []}
        for rep in range(args.reps):
            order = (True, False) if rep % 2 == 0 else (False, True)
            for per_row in order:
                runs[per_row].append(run_once(target, prompt, reference, acceptance, per_row, args.tokens, seed=rep))
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(runs[True], runs[False])]
        med = {k: {f: statistics.median(r[f] for r in v) for f in ("tok_s", "rollback_ms", "snapshot_ms", "verify_ms", "acceptance")}
               for k, v in runs.items()}
        row = {
            "snapshots": med[True], "restore": med[False], "ratio_median": statistics.median(ratios),
            "ratios": ratios, "modes": {"snapshots": runs[True][0]["modes"], "restore": runs[False][0]["modes"]},
        }
        results["acceptance"][str(acceptance)] = row
        print(f"acceptance {acceptance:.1f} (measured {med[True]['acceptance']:.2f}): "
              f"snapshots {med[True]['tok_s']:.2f} tok/s vs restore {med[False]['tok_s']:.2f} tok/s -> "
              f"{row['ratio_median']:.2f}x | rollback ms/step {med[True]['rollback_ms']:.2f} vs "
              f"{med[False]['rollback_ms']:.1f} | snapshot ms/step {med[True]['snapshot_ms']:.3f} vs "
              f"{med[False]['snapshot_ms']:.2f}")
    slots_ms, plain_ms = verify_overhead(target, prompt, max(args.reps, 5) * 2)
    overhead = (slots_ms - plain_ms) / plain_ms
    results["verify_overhead"] = {"slots_ms": slots_ms, "in_place_ms": plain_ms, "overhead": overhead}
    print(f"{VERIFY_ROWS}-row verify: with per-row slots {slots_ms:.1f} ms vs in place {plain_ms:.1f} ms "
          f"-> snapshot overhead {100 * overhead:+.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
