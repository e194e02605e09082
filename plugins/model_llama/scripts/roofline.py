"""The roofline of a forward on this CPU: its float32 fused multiply-add peak and its memory read
bandwidth (measured here, by the compiled kernels' probes), the embedded model's weight bytes and
multiply-adds per row, and from them the least time a 1-row and a k-row forward can take; then
the measured forwards beside the bounds (1 and k rows alternating, at a context, every row's
logits as a verify).

The bounds use the best rate observed (a shared machine's other jobs only lower the figures):
the FMA peak per CPU-second of one core times the threads, and the best wall-time bandwidth of
any thread count measured.
A k-row forward streams the weights once and does k times the arithmetic, so its bound is
max(bytes / bandwidth, k x multiply-adds / FMA peak); the ratio of the k-row bound to the 1-row
bound is the least verify-to-decode cost ratio the float32 arithmetic allows here. The int8
path's own multiply-add peak (``probe_int8``: its dot instructions, independent accumulators,
CPU time) is printed beside it; with ``--dtype int8`` the matmuls' bound uses it (attention stays
float32) and the forwards run the int8 arithmetic.

    python plugins/model_llama/scripts/roofline.py [--threads 2] [--rows 9] [--context 500] [--reps 7] [--dtype int8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tsspec_gguf import native
from tsspec_gguf.embedded import embedded_model_path



def fma_peak(reps: int) -> tuple[float, float]:
    """Float32 multiply-adds (lanes, not instructions) per CPU-second of one core (a shared
    machine's other jobs do not lower it): (best, median) over reps of ``native.fma_rate``."""
    iters, chunks = 1_000_000, 8
    native.fma_rate(1000, chunks)
    rates = [native.fma_rate(iters, chunks) for _ in range(reps)]
    return max(rates), statistics.median(rates)


def int8_peak(reps: int) -> tuple[float, float] | None:
    """int8 multiply-adds per CPU-second of one core on the int8 path's instructions: (best,
    median) over reps of ``native.int8_rate``; None without the probe."""
    iters, chunks = 1_000_000, 8
    if native.int8_rate(1000, chunks) is None:
        return None
    rates = [native.int8_rate(iters, chunks) for _ in range(reps)]
    return max(rates), statistics.median(rates)


def read_bandwidth(kernels, threads: int, reps: int, mib: int = 512) -> tuple[float, float]:
    """Bytes per second summing a buffer far larger than the caches, wall time: (best, median)."""
    buf = torch.ones(mib * 2**20 // 4)
    kernels.probe_read(buf.data_ptr(), buf.numel(), 64, threads)
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        kernels.probe_read(buf.data_ptr(), buf.numel(), 64, threads)
        rates.append(buf.numel() * 4 / (time.perf_counter() - start))
    return max(rates), statistics.median(rates)


def main() -> int:
    from tsspec_model_llama import load_llama

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=9)
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10, help="forwards timed together per measurement")
    ap.add_argument("--dtype", default="float32-blocks", help="the target's arithmetic: float32-blocks or int8")
    args = ap.parse_args()
    kernels = native.probes()
    if kernels is None:
        raise SystemExit("roofline: the probes' build is absent (reinstall tsspec-gguf with TSSPEC_BUILD_PROBES=1)")
    torch.set_num_threads(args.threads)
    print(f"kernels: {native.info()}; threads {args.threads}")
    core_best, core_median = fma_peak(args.reps)
    print(f"float32 FMA peak per core (CPU time): best {core_best / 1e9:.1f}, median {core_median / 1e9:.1f} "
          f"G multiply-adds/s ({2 * core_best / 1e9:.1f} GFLOP/s); {args.threads} idle cores: "
          f"{args.threads * core_best / 1e9:.1f} G multiply-adds/s")
    int8 = int8_peak(args.reps)
    if int8 is not None:
        print(f"int8 multiply-add peak per core (CPU time, {native.info()['int8']}): best {int8[0] / 1e9:.1f}, "
              f"median {int8[1] / 1e9:.1f} G multiply-adds/s ({int8[0] / core_best:.2f}x float32's); "
              f"{args.threads} idle cores: {args.threads * int8[0] / 1e9:.1f} G multiply-adds/s")
    if args.dtype == "int8" and int8 is None:
        raise SystemExit("roofline: --dtype int8 needs the kernels' int8 probe")
    bands = {t: read_bandwidth(kernels, t, args.reps) for t in sorted({1, args.threads})}
    for t, (best, median) in bands.items():
        print(f"read bandwidth, {t} thread(s) (wall time): best {best / 1e9:.1f}, median {median / 1e9:.1f} GB/s")

    target = load_llama(embedded_model_path(), {"dtype": args.dtype})
    hp = target.hparams
    matrices = [m for layer in target._layers for m in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)]
    matrices.append(target._lm_head)
    weight_bytes = sum(m.nbytes for m in matrices)
    macs = sum(m.shape[0] * m.shape[1] for m in matrices)  # per row
    # attention per row at this context: scores and the weighted sum of V, every query head
    attn_macs = hp.n_layers * hp.n_heads * hp.head_dim * 2 * args.context
    # the best observed (a forward on `threads` threads can stream at least as fast as on fewer)
    peak, band = args.threads * core_best, max(best for best, _ in bands.values())
    mat_peak = args.threads * int8[0] if args.dtype == "int8" else peak  # the matmuls' arithmetic

    def bound_ms(rows: int) -> float:
        return max(weight_bytes / band, rows * (macs / mat_peak + attn_macs / peak)) * 1000

    one, many = bound_ms(1), bound_ms(args.rows)
    print(f"embedded model: {weight_bytes / 1e6:.1f} MB of weights as the kernels hold them, "
          f"{macs / 1e6:.1f} M multiply-adds per row in matmuls + {attn_macs / 1e6:.1f} M in attention "
          f"at {args.context} tokens")
    print(f"bounds on {args.threads} threads at {band / 1e9:.1f} GB/s: 1 row {one:.2f} ms (weights {weight_bytes / band * 1000:.2f} ms, "
          f"arithmetic {(macs / mat_peak + attn_macs / peak) * 1000:.2f} ms, matmuls in {args.dtype}); {args.rows} rows {many:.2f} ms; "
          f"{args.rows} rows / 1 row >= {many / one:.2f}x")

    target.reset()
    target.spec_forward([100 + (i * 7) % 5000 for i in range(args.context)], all_logits_rows=False, want_hidden=False)

    def forward_ms(rows: int) -> float:
        start = time.perf_counter()
        for _ in range(args.steps):
            at = target.cache_seq_len
            target.spec_forward([5] * rows, all_logits_rows=True, want_hidden=False)
            target.spec_rewind_cache(at + 1)
        return (time.perf_counter() - start) / args.steps * 1000

    times = {1: [], args.rows: []}
    for rep in range(args.reps):
        for rows in (1, args.rows) if rep % 2 == 0 else (args.rows, 1):
            times[rows].append(forward_ms(rows))
    m1, mk = statistics.median(times[1]), statistics.median(times[args.rows])
    paired = statistics.median(b / a for a, b in zip(times[1], times[args.rows]))
    print(f"measured at {args.context} tokens ({target.precision}): 1 row {m1:.2f} ms ({one / m1:.0%} of its bound), "
          f"{args.rows} rows {mk:.2f} ms ({many / mk:.0%} of its bound); {args.rows} rows / 1 row {mk / m1:.2f}x "
          f"(paired {paired:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
