"""The compiled attention at the embedded model's shapes (9 query heads, 3 KV heads, head size 64)
by rows x context, one of its switches off against on (the default), paired (the two alternate
within each round, their order swapped every round; medians over rounds): ``tree``, the scores'
horizontal sums 4 or 8 at once (``set_tree_sums``); ``segments``, chunks of (key segment, KV
head) carrying all of its queries, against chunks of query heads over all keys. With one thread the time is the thread's CPU time,
else wall time.

    python plugins/model_llama/scripts/attention_bench.py [--switch tree|segments] [--threads 1]
        [--rows 1,3,9] [--contexts 100,500] [--rounds 9] [--calls 200] [--baseline PATH/_cpu_kernels.so]

``--baseline PATH`` compares another build of ``cpu_kernels.c`` (side A) with the installed one
(side B) instead of a switch. The KV cache here is one layer's and stays in cache; in a model step each
layer's K and V rows come from memory.

``--in-step`` times attention there instead: the embedded model after a prefill of each context,
``--steps`` forwards of each row count per side and round (every row's logits, as a verify; the
cache rewound after each), with the kernels' pool statistics on: the attention regions' wall time
per forward (all 30 layers) and the forward's wall time (with one thread: the caller's CPU time
in both), switch off against on, paired as above. ``--prefill N`` (with ``--in-step``) times a
prefill of N tokens from an empty cache instead (attention in slices of 64 rows, called from
``attention.py``: its regions count as the pool's kind "other", which the prefill's other row ops
outside the gemms share).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch

from tsspec_gguf import native

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch", choices=("tree", "segments"), default="segments")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,3,9")
    ap.add_argument("--contexts", default="100,500")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=200, help="calls timed together per measurement")
    ap.add_argument("--baseline", default=None, help="another build of the kernels as side A")
    ap.add_argument("--in-step", action="store_true", help="attention inside the embedded model's forward")
    ap.add_argument("--steps", type=int, default=10, help="--in-step: forwards per side and round")
    ap.add_argument("--prefill", type=int, default=0, help="--in-step: time a prefill of this many tokens")
    args = ap.parse_args()
    kernels = native.kernels()
    setter_name = {"tree": "set_tree_sums", "segments": "set_key_segments"}[args.switch]
    if kernels is None or not hasattr(kernels, setter_name):
        raise SystemExit(f"attention_bench: the compiled kernels (with {setter_name}) are not built")
    toggle = getattr(kernels, setter_name)
    modules = {False: kernels, True: kernels}  # side A (off / baseline), side B (on / installed)
    if args.baseline is not None:
        spec = importlib.util.spec_from_file_location("_cpu_kernels", args.baseline)
        modules[False] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[False])

    def use(side_b: bool) -> None:
        if args.baseline is None:
            toggle(side_b)
    names = ("baseline", "installed") if args.baseline is not None else (f"{args.switch} off", "on")
    if args.in_step:
        if args.baseline is not None:
            raise SystemExit("attention_bench: --in-step pairs a switch, not a --baseline build")
        return in_step(kernels, toggle, args)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"kernels: {native.info()}; threads {args.threads}; {HEADS} heads, {KV_HEADS} KV heads, head size {HEAD_DIM}")
    for context in [int(c) for c in args.contexts.split(",")]:
        for rows in [int(r) for r in args.rows.split(",")]:
            cap = context + rows
            g = torch.Generator().manual_seed(rows)
            k, v = torch.randn(KV_HEADS, cap, HEAD_DIM, generator=g), torch.randn(KV_HEADS, cap, HEAD_DIM, generator=g)
            q = torch.randn(rows, HEADS * HEAD_DIM, generator=g) * HEAD_DIM**-0.5
            out = torch.empty(rows, HEADS * HEAD_DIM)
            times = {False: [], True: []}
            for rnd in range(args.rounds):
                for side_b in (False, True) if rnd % 2 == 0 else (True, False):
                    use(side_b)
                    module = modules[side_b]
                    start = clock()
                    for _ in range(args.calls):
                        module.attention(q.data_ptr(), HEADS * HEAD_DIM, k.data_ptr(), v.data_ptr(), cap, out.data_ptr(),
                                          rows, HEADS, KV_HEADS, HEAD_DIM, context, args.threads)
                    times[side_b].append((clock() - start) / args.calls * 1000)
            use(True)
            one, two = statistics.median(times[False]), statistics.median(times[True])
            paired = statistics.median(b / a for a, b in zip(times[False], times[True]))
            print(f"context {context}, rows {rows}: {names[0]} {one:.4f} ms, {names[1]} {two:.4f} ms; "
                  f"{names[1]} / {names[0]} {two / one:.3f} (paired {paired:.3f})")
    return 0


def in_step(kernels, toggle, args) -> int:
    """Attention's pool regions inside the embedded model's forwards, switch off (A) against on
    (B): ms per forward (all layers), medians over rounds and the median of the paired ratios."""
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec_model_llama import load_llama

    torch.set_num_threads(args.threads)
    clock, field = (time.thread_time, "caller_cpu_ns") if args.threads == 1 else (time.perf_counter, "wall_ns")
    target = load_llama(embedded_model_path(), {"dtype": "float32-blocks"})
    print(f"kernels: {native.info()}; threads {args.threads}; embedded model; {args.rounds} rounds of "
          f"{args.steps} forwards a side; A = {args.switch} off, B = on; ms per forward (medians)")
    print("context | rows | attention A | attention B | B/A (paired) | forward A | forward B | B/A (paired)")
    try:
        if args.prefill:
            ids = [100 + (i * 7) % 5000 for i in range(args.prefill)]
            got = {False: [], True: []}
            for rnd in range(args.rounds + 1):  # round 0 warms up
                for side_b in (False, True) if rnd % 2 == 0 else (True, False):
                    toggle(side_b)
                    target.spec_rewind_cache(0)
                    kernels.set_pool_stats(True)
                    start = clock()
                    target.spec_forward(ids, all_logits_rows=False, want_hidden=False)
                    wall = (clock() - start) * 1e3
                    attn = kernels.pool_stats().get("other", {}).get(field, 0) / 1e6
                    kernels.set_pool_stats(False)
                    if rnd:
                        got[side_b].append((attn, wall))
            print(f"{0:7d} | {args.prefill:4d} | " + " | ".join(columns(got)))
            return 0
        for context in [int(c) for c in args.contexts.split(",")]:
            target.spec_rewind_cache(0)
            target.spec_forward([5] * context, all_logits_rows=False, want_hidden=False)
            for rows in [int(r) for r in args.rows.split(",")]:
                got = {False: [], True: []}  # per side: (attention ms, forward ms) a round
                for rnd in range(args.rounds + 1):  # round 0 warms up
                    for side_b in (False, True) if rnd % 2 == 0 else (True, False):
                        toggle(side_b)
                        kernels.set_pool_stats(True)
                        start = clock()
                        for _ in range(args.steps):
                            target.spec_forward([5] * rows, all_logits_rows=True, want_hidden=False)
                            target.spec_rewind_cache(context)
                        wall = (clock() - start) / args.steps * 1e3
                        attn = kernels.pool_stats().get("attention", {}).get(field, 0) / args.steps / 1e6
                        kernels.set_pool_stats(False)
                        if rnd:
                            got[side_b].append((attn, wall))
                print(f"{context:7d} | {rows:4d} | " + " | ".join(columns(got)))
    finally:
        toggle(True)
        kernels.set_pool_stats(False)
    return 0


def columns(got: dict) -> list[str]:
    """Per measure (attention, forward): side A's and B's medians, B/A of medians (and paired)."""
    cells = []
    for i in (0, 1):
        a = statistics.median(v[i] for v in got[False])
        b = statistics.median(v[i] for v in got[True])
        paired = statistics.median(y[i] / x[i] for x, y in zip(got[False], got[True]))
        cells.append(f"{a:11.3f} | {b:11.3f} | {b / a:.3f} ({paired:.3f})")
    return cells


if __name__ == "__main__":
    raise SystemExit(main())
