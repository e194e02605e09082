"""Phase-counter benchmark: draft-head calls per decode step, with and without folding.

Runs the same generation twice per draft window on the exact toy target with an oracle toy head
(``tsspec_model_toy.heads``): once with the catch-up folded into the next proposal's first step
(``TS_MTP_FOLD_CATCHUP=1``, the default) and once unfolded (``=0``). Prints, per run, head calls
per decode step, the split into draft steps / catch-ups / fused calls, acceptance, and the draft
and commit phase milliseconds; checks that both runs emit the same tokens with the same
acceptance. ``--head-call-ms`` adds a fixed cost to every head call (a real head's per-call
overhead is mostly fixed: launches, a projection), so the saving shows up in milliseconds too.

    python plugins/spec_draft_head/scripts/bench_head_calls.py --windows 1 3 8 --head-call-ms 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.testing import ToyTarget
from tsspec_model_toy.heads import ToyPerTokenHead
from tsspec_draft_head import FOLD_ENV, make_draft_head

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
TARGET_SEED = 2
HEAD_SEED = 5
ORACLE_SCALE = 4.0


class CostlyHead:
    """Adds a fixed delay to every head call; everything else is the wrapped head's."""

    def __init__(self, head: ToyPerTokenHead, call_s: float):
        self._head, self._call_s = head, call_s

    def __getattr__(self, name):
        value = getattr(self._head, name)
        if self._call_s and name in ("draft_step", "draft_catch_up", "draft_catch_up_and_step"):
            def delayed(*args, _fn=value):
                time.sleep(self._call_s)
                return _fn(*args)
            return delayed
        return value


def run_once(window: int, fold: bool, args) -> dict:
    os.environ[FOLD_ENV] = "1" if fold else "0"
    target = ToyTarget(seed=TARGET_SEED, per_row_snapshots=True)
    head = ToyPerTokenHead.for_target(
        target, oracle_target=ToyTarget(seed=TARGET_SEED, per_row_snapshots=True),
        oracle_scale=ORACLE_SCALE, seed=HEAD_SEED,
    )
    target.draft_head = CostlyHead(head, args.head_call_ms / 1000.0)
    options = SpeculationOptions(adaptive=False, draft=window, pmin=args.pmin)
    speculator = make_draft_head(target, options)
    gen = generate(target, PROMPT, options, max_tokens=args.tokens, speculator=speculator)
    stats, counters = gen.stats, speculator.counters
    return {
        "window": window,
        "fold": fold,
        "tokens": gen.tokens,
        "steps": stats.steps,
        "head_calls": head.calls,
        "draft_steps": head.step_calls,
        "fused": head.fused_calls,
        "catch_ups": head.catch_up_calls,
        "calls_per_step": head.calls / stats.steps,
        "calls_per_proposal": head.calls / max(1, counters.proposals),
        "extra_calls_per_step": (head.calls - counters.drafted - counters.gate_stops) / stats.steps,
        "acceptance": stats.acceptance_rate,
        "accepted": stats.accepted_tokens,
        "drafted": stats.draft_tokens,
        "draft_ms": stats.phase_ms["draft"],
        "commit_ms": stats.phase_ms["commit"],
        "decode_ms": stats.decode_ms,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 3, 8])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--pmin", type=float, default=0.75)
    parser.add_argument("--head-call-ms", type=float, default=0.0, help="fixed cost added per head call")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (median ms)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    saved = os.environ.get(FOLD_ENV)
    rows, ok = [], True
    try:
        for window in args.windows:
            pair = {}
            for fold in (True, False):
                runs = [run_once(window, fold, args) for _ in range(args.repeats)]
                row = dict(runs[0])
                for key in ("draft_ms", "commit_ms", "decode_ms"):
                    row[key] = statistics.median(r[key] for r in runs)
                pair[fold] = row
                rows.append(row)
            same = pair[True]["tokens"] == pair[False]["tokens"] and all(
                pair[True][k] == pair[False][k] for k in ("accepted", "drafted", "steps")
            )
            ok &= same
            pair[True]["identical_to_unfolded"] = pair[False]["identical_to_unfolded"] = same
    finally:
        if saved is None:
            os.environ.pop(FOLD_ENV, None)
        else:
            os.environ[FOLD_ENV] = saved
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "tokens"} for r in rows], indent=1))
    else:
        print(f"toy target seed {TARGET_SEED}, oracle toy head, {args.tokens} tokens, pmin {args.pmin}, "
              f"+{args.head_call_ms} ms per head call, median of {args.repeats}")
        print("window fold  steps calls/step extra/step steps+fused+catchup accept  draft_ms commit_ms decode_ms same")
        for r in rows:
            print(
                f"{r['window']:>6} {('on' if r['fold'] else 'off'):<4} {r['steps']:>6} "
                f"{r['calls_per_step']:>10.2f} {r['extra_calls_per_step']:>10.2f} "
                f"{r['draft_steps']:>7}+{r['fused']:<3}+{r['catch_ups']:<8} {r['acceptance']:>6.2f} "
                f"{r['draft_ms']:>9.1f} {r['commit_ms']:>9.1f} {r['decode_ms']:>9.1f} {r['identical_to_unfolded']}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
