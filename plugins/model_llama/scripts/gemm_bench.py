"""The block kernel's matmul on the embedded model's own matrices, by rows: time per call and
the weight bytes streamed per second, for both arithmetics, paired (the arithmetics alternate
within each round; medians over rounds). With one thread the time is the thread's CPU time (less
disturbed by other processes on a shared machine), else wall time.

    python plugins/model_llama/scripts/gemm_bench.py [--threads 2] [--rows 1,2,4,9] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tsspec.modeling import native
from tsspec.modeling.embedded import embedded_model_path


def main() -> int:
    from tsspec_model_llama import load_llama

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,4,9")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20, help="calls timed together per measurement")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    kernels = native.kernels()
    target = load_llama(embedded_model_path())
    layer = target._layers[0]
    matrices = {"wqkv": layer.wqkv, "wo": layer.wo, "gate_up": layer.w_gate_up, "down": layer.w_down,
                "lm_head": target._lm_head}
    print(f"kernels: {native.info()}; threads {args.threads}")
    print("matrix (fmt, N x K, MiB) | rows | float32 ms (GB/s) | int8 ms (GB/s) | int8 speed-up")
    for name, w in matrices.items():
        n, k = w.shape
        mib = w.nbytes / 2**20
        for r in rows:
            x = torch.randn(r, k)
            out = torch.empty(r, n)
            times = {False: [], True: []}
            clock = time.thread_time if args.threads == 1 else time.perf_counter
            for rnd in range(args.rounds):
                for int8 in ((False, True) if rnd % 2 == 0 else (True, False)):
                    start = clock()
                    for _ in range(args.calls):
                        kernels.gemm(w.fmt, w.q.data_ptr(), w.d.data_ptr(), w.m.data_ptr(), n, k, x.data_ptr(), r,
                                     out.data_ptr(), 0, args.threads, int8)
                    times[int8].append((clock() - start) / args.calls * 1000)
            f, i = statistics.median(times[False]), statistics.median(times[True])
            gbs = lambda ms: w.nbytes / ms / 1e6  # noqa: E731
            print(f"{name} (q{w.fmt}, {n}x{k}, {mib:.1f}) | {r} | {f:.3f} ({gbs(f):.1f}) | {i:.3f} ({gbs(i):.1f}) | {f / i:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
