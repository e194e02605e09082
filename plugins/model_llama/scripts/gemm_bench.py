"""The block kernel's matmul on the embedded model's own matrices, by rows: time per call and
the weight bytes streamed per second, paired (the two sides alternate within each round, their
order swapped every round; medians over rounds). Side A / side B: the float32 / int8 arithmetic
of the installed kernels, or with ``--baseline PATH`` another build of ``cpu_kernels.c`` / the
installed one, both in the ``--dtype`` arithmetic, or with ``--switch NAME`` the installed kernels
with ``set_NAME(False)`` / ``set_NAME(True)`` (the default side; ``NAME+OTHER`` flips several
together), both in ``--dtype``. With one thread the time is the thread's CPU
time (less disturbed by other processes on a shared machine), else wall time.

    python plugins/model_llama/scripts/gemm_bench.py [--threads 2] [--rows 1,2,4,9] [--rounds 7]
        [--baseline PATH/_cpu_kernels.so | --switch wide_tiles] [--dtype float32|int8]
        [--matrices gate_up,lm_head]
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
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,4,9")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20, help="calls timed together per measurement")
    ap.add_argument("--baseline", default=None, help="another build of the kernels as side A")
    ap.add_argument("--switch", default=None, help="side A: set_SWITCH(False), side B: set_SWITCH(True)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "int8"), help="with --baseline or --switch")
    ap.add_argument("--matrices", default="wqkv,wo,gate_up,down,lm_head")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    kernels = native.kernels()
    target = load_llama(embedded_model_path())
    layer = target._layers[0]
    matrices = {"wqkv": layer.wqkv, "wo": layer.wo, "gate_up": layer.w_gate_up, "down": layer.w_down,
                "lm_head": target._lm_head}
    setters = [getattr(kernels, f"set_{name}") for name in args.switch.split("+")] if args.switch else []

    def switch(on: bool) -> None:
        for setter in setters:
            setter(on)

    flips = {"A": False, "B": True} if args.switch else {"A": True, "B": True}
    if args.switch:
        int8 = args.dtype == "int8"
        sides = {"A": (kernels, int8), "B": (kernels, int8)}
        names = (f"set_{args.switch}(False) {args.dtype}", f"set_{args.switch}(True) {args.dtype}")
    elif args.baseline is None:
        sides = {"A": (kernels, False), "B": (kernels, True)}
        names = ("float32", "int8")
    else:
        int8 = args.dtype == "int8"
        sides = {"A": (native.load_build(args.baseline), int8), "B": (kernels, int8)}
        names = (f"baseline {args.dtype}", f"installed {args.dtype}")
    print(f"kernels: {native.info()}; threads {args.threads}")
    print(f"matrix (fmt, N x K, MiB) | rows | A = {names[0]} ms (GB/s) | B = {names[1]} ms (GB/s) | A/B "
          "(paired median)")
    for name in args.matrices.split(","):
        w = matrices[name]
        n, k = w.shape
        mib = w.nbytes / 2**20
        for r in rows:
            x = torch.randn(r, k)
            out = torch.empty(r, n)
            times = {"A": [], "B": []}
            clock = time.thread_time if args.threads == 1 else time.perf_counter
            for rnd in range(args.rounds):
                for side in (("A", "B") if rnd % 2 == 0 else ("B", "A")):
                    module, int8 = sides[side]
                    switch(flips[side])
                    start = clock()
                    for _ in range(args.calls):
                        module.gemm(w.fmt, w.q.data_ptr(), w.d.data_ptr(), w.m.data_ptr(), n, k, x.data_ptr(), r,
                                    out.data_ptr(), 0, args.threads, int8)
                    times[side].append((clock() - start) / args.calls * 1000)
            switch(True)
            a, b = statistics.median(times["A"]), statistics.median(times["B"])
            paired = statistics.median(x / y for x, y in zip(times["A"], times["B"]))
            gbs = lambda ms: w.nbytes / ms / 1e6  # noqa: E731
            print(f"{name} (q{w.fmt}, {n}x{k}, {mib:.1f}) | {r} | {a:.3f} ({gbs(a):.1f}) | {b:.3f} ({gbs(b):.1f}) | "
                  f"{a / b:.2f}x ({paired:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
