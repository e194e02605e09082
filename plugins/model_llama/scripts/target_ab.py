"""Paired A/B of one-row steps on two loads of the embedded model in one process: side A's weights
on 4 KiB pages (the kernels' huge pages off while it loads) and, with ``--baseline PATH``, run on
another build of ``plugins/gguf/src/tsspec_gguf/cpu_kernels.c``; side B loaded and run as installed (huge pages
on where the system allows). Each side has its own weights, KV cache and pages, so what differs
between them is what happened at load (the pages) and the kernels.

After a prefill of ``--context`` tokens per side, each round times ``--steps`` one-row forwards
(each rewound to the same length) on each side, sides alternating and their order swapped every
round (the caller's CPU time with ``--threads 1``, else wall time). ``--order BA`` loads side B
first (the second load's memory may sit differently: run both orders). Prints median ms per
step, B/A as the ratio of medians and the median of the paired round ratios.

    python plugins/model_llama/scripts/target_ab.py [--context 500] [--threads 1] [--rounds 21]
        [--steps 10] [--order AB] [--baseline PATH/_cpu_kernels.so]
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
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--order", choices=("AB", "BA"), default="AB", help="which side loads first")
    ap.add_argument("--baseline", default=None, help="another build of the kernels for side A")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kernels = native.kernels()
    if kernels is None or not hasattr(kernels, "set_huge_pages"):
        raise SystemExit("target_ab: these kernels have no huge-pages switch")
    build = native.load_build(args.baseline) if args.baseline else None
    targets = {}
    try:
        for side in args.order:
            kernels.set_huge_pages(side == "B")
            target = load_llama(embedded_model_path(), {"dtype": "float32-blocks"})
            if side == "A" and build is not None:  # its blocks and one-call step described for that build
                target._kernels = build
                target._stack = target._layer_stack()
                target._step_head = target._native_head()
            targets[side] = target
    finally:
        kernels.set_huge_pages(True)

    def use(side: str):
        native._module = targets[side]._kernels
        return targets[side]

    for side in "AB":
        use(side).spec_forward([100 + (i * 7) % 5000 for i in range(args.context)], all_logits_rows=False,
                               want_hidden=False)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    times: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
            target = use(side)
            start = clock()
            for _ in range(args.steps):
                at = target.cache_seq_len
                target.spec_forward([5], all_logits_rows=True, want_hidden=False)
                target.spec_rewind_cache(at)
            times[side].append((clock() - start) / args.steps * 1000)
    use("B")
    a, b = statistics.median(times["A"]), statistics.median(times["B"])
    paired = statistics.median(y / x for x, y in zip(times["A"], times["B"]))
    print(f"kernels: {native.info()}; threads {args.threads}; context {args.context}; load order {args.order}; "
          f"A = {args.baseline or 'installed'} on 4 KiB pages, B = installed, {targets['B'].huge_page_bytes} bytes "
          f"on huge pages")
    print(f"A {a:.3f} ms, B {b:.3f} ms a step; B/A {b / a:.3f} (paired {paired:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
