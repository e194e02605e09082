"""Paired A/B of the embedded model's forward by rows x context: the fused block path (one native
call for every block) against the per-op path, the installed kernels against another build, or
one arithmetic against another (a second load of the file).

Each round alternates the two sides (and their order) on the same target and KV cache: after a
prefill of ``context`` tokens, ``--steps`` forwards of ``rows`` rows (every row's logits, as a
verify), each rewound to one new token (timed in the caller's CPU time with ``--threads 1``, else
wall time). Prints median milliseconds per forward, the B/A ratio
(of medians, and the median of the paired round ratios) and each side's cost relative to one row.

    python plugins/model_llama/scripts/forward_ab.py [--dtype int8] [--contexts 100,500]
        [--rows 1,2,4,9] [--reps 7] [--threads 2]
        [--baseline per-op | PATH/_cpu_kernels.so | dtype:NAME | switch:NAME]

``--baseline PATH`` loads another build of ``plugins/gguf/src/tsspec_gguf/cpu_kernels.c`` (e.g. an older
commit's, compiled with ``gcc -O3 -std=c11 -pthread -shared -fPIC -I<python include>``) as side
A; a build without ``layers_new`` runs the per-op path. ``--baseline dtype:float32-blocks`` (with
``--dtype int8``, say) runs side A on a second load of the file in that arithmetic, each side on
its own target and KV cache. ``--baseline switch:NAME`` runs both sides on the installed fused path,
side A with the kernels' ``set_NAME(False)``, side B with ``set_NAME(True)`` (the default);
``switch:NAME+OTHER`` flips several switches together.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tsspec_gguf import native
from tsspec_gguf.embedded import embedded_model_path


def main() -> int:
    from tsspec_model_llama import load_llama

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32-blocks", help="float32-blocks or int8")
    ap.add_argument("--contexts", default="100,500")
    ap.add_argument("--rows", default="1,2,4,9")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline", default="per-op")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows_set = [int(r) for r in args.rows.split(",")]
    target = load_llama(embedded_model_path(), {"dtype": args.dtype})
    targets = {"A": target, "B": target}
    sides = {"B": (native.kernels(), target._stack, True, target._step_head)}
    flips = {"A": True, "B": True}
    setters = []  # the kernels' set_NAME of a switch:NAME baseline
    if args.baseline.startswith("switch:"):
        setters = [getattr(native.kernels(), f"set_{name}") for name in args.baseline.split(":", 1)[1].split("+")]
        sides["A"], flips["A"] = sides["B"], False
    elif args.baseline == "per-op":
        sides["A"] = (native.kernels(), target._stack, False, target._step_head)
    elif args.baseline.startswith("dtype:"):
        targets["A"] = load_llama(embedded_model_path(), {"dtype": args.baseline.split(":", 1)[1]})
        sides["A"] = (native.kernels(), targets["A"]._stack, True, targets["A"]._step_head)
    else:
        build = native.load_build(args.baseline)
        native._module, target._kernels = build, build
        stack = target._layer_stack()
        held = target._step_work  # side B's head holds its address: keep it alive
        target._stack = stack  # the one-call step's head described for that build (its arguments)
        sides["A"] = (build, stack, True, target._native_head())
        target._held_work = held

    def switch(on: bool) -> None:
        for setter in setters:
            setter(on)

    def use(side: str) -> None:
        nonlocal target
        target = targets[side]
        kernels, stack, fused, head = sides[side]
        native._module = target._kernels = kernels
        target._stack, target.fused_blocks, target._step_head = stack, fused, head
        switch(flips[side])

    # one thread: the caller's CPU time (every op runs on it; other processes on a shared machine
    # disturb it far less than wall time); more threads: wall time
    clock = time.thread_time if args.threads == 1 else time.perf_counter

    def forward_ms(rows: int) -> float:
        start = clock()
        for _ in range(args.steps):
            at = target.cache_seq_len
            target.spec_forward([5] * rows, all_logits_rows=True, want_hidden=False)
            target.spec_rewind_cache(at + 1)
        return (clock() - start) / args.steps * 1000

    print(f"kernels: {native.info()}; arithmetic {target.precision}; threads {args.threads}; "
          f"A = {args.baseline}, B = installed fused")
    for context in [int(c) for c in args.contexts.split(",")]:
        for side in {id(t): s for s, t in targets.items()}.values():
            use(side)
            target.reset()
            target.spec_forward([100 + (i * 7) % 5000 for i in range(context)], all_logits_rows=False,
                                want_hidden=False)
        times = {(s, r): [] for s in sides for r in rows_set}
        for rep in range(args.reps):
            for r in rows_set:
                for side in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                    use(side)
                    times[(side, r)].append(forward_ms(r))
        med = {key: statistics.median(v) for key, v in times.items()}
        for r in rows_set:
            paired = statistics.median(b / a for a, b in zip(times[("A", r)], times[("B", r)]))
            print(f"context {context}, rows {r}: A {med[('A', r)]:.2f} ms ({med[('A', r)] / med[('A', 1)]:.2f}x one row), "
                  f"B {med[('B', r)]:.2f} ms ({med[('B', r)] / med[('B', 1)]:.2f}x); B/A {med[('B', r)] / med[('A', r)]:.3f} "
                  f"(paired {paired:.3f})")
    use("B")
    switch(True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
