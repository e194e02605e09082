"""The physical picture of one decode step, measured on the machine the bench runs on.

A decode step streams every weight matrix once (plain decode is bound by memory bandwidth) and a
k-row verify streams the same bytes once but does k times the multiply-adds (2 flops per weight
per row). Two figures of this machine bound both: the memory read bandwidth at the thread count
the bench runs with (a torch sum over a buffer far larger than the caches, best of a few) and
the float32 multiply-add rate: the hardware's fused multiply-add peak where tsspec's compiled
kernels can probe it (independent FMA chains timed in CPU seconds of one core, times the
threads), else a large torch float32 matmul (best of a few, 1 thread and all), which runs below
the peak and so gives a floor that is too high. Where the kernels can probe it, a third: the
int8 path's multiply-add peak (its own dot instructions, independent accumulators, CPU seconds).
From them and the target's weight bytes come the streaming floor of a step and the lowest
9-row / 1-row cost ratio a float32 kernel (and an int8 one) can reach here: nothing is assumed
about the CPU.

Every figure is measured when the bench runs (a few seconds); nothing here is a constant taken
from another machine.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

BANDWIDTH_MIB = 256  # the summed buffer: far above any last-level cache of these CPUs
BANDWIDTH_REPS = 5
MATMUL_SIZE = 1024  # a square float32 matmul: 2 * 1024^3 flops, compute-bound on any CPU
MATMUL_REPS = 5
FMA_ITERS = 200_000  # probe iterations per chunk: ~0.1 s of one core
FMA_CHUNKS = 4
SKIPPED_ATTRIBUTES = ("draft_head", "tokenizer")  # reachable from a target, but not its weights


def _best_seconds(work: Callable[[], object], reps: int) -> float:
    """The fastest of ``reps`` timed calls after one untimed call."""
    work()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


class _Threads:
    """torch's intra-op thread count set for a block, restored after."""

    def __init__(self, threads: int):
        self.threads, self.previous = threads, torch.get_num_threads()

    def __enter__(self):
        torch.set_num_threads(self.threads)

    def __exit__(self, *exc):
        torch.set_num_threads(self.previous)


def read_bandwidth(threads: int, *, mib: int = BANDWIDTH_MIB, reps: int = BANDWIDTH_REPS) -> float:
    """Bytes per second a ``threads``-thread sum reads from memory (best of ``reps``)."""
    buffer = torch.ones(mib * 1024 * 1024 // 4, dtype=torch.float32)  # [mib MiB / 4 bytes]
    with _Threads(threads):
        seconds = _best_seconds(lambda: buffer.sum(), reps)
    return buffer.numel() * buffer.element_size() / seconds


def float32_rate(threads: int, *, size: int = MATMUL_SIZE, reps: int = MATMUL_REPS) -> float:
    """float32 flops per second of a ``size`` x ``size`` matmul on ``threads`` threads (best of
    ``reps``; a multiply-add counts 2)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen)  # [size, size]
    b = torch.randn(size, size, generator=gen)  # [size, size]
    out = torch.empty(size, size)
    with _Threads(threads):
        seconds = _best_seconds(lambda: torch.mm(a, b, out=out), reps)
    return 2.0 * size ** 3 / seconds


def fma_peak(threads: int, *, reps: int = BANDWIDTH_REPS) -> float | None:
    """float32 flops per second at the CPU's fused multiply-add peak on ``threads`` cores: the
    best of ``reps`` runs of the compiled kernels' probe on one core (``native.fma_rate``),
    times ``threads``; None where the probes' build (``TSSPEC_BUILD_PROBES=1`` at the toolkit's
    install) or its AVX2 path are absent."""
    from tsspec_gguf import native

    if native.fma_rate(1000, FMA_CHUNKS) is None:  # also the untimed warm-up
        return None
    best = max((native.fma_rate(FMA_ITERS, FMA_CHUNKS) or 0.0) for _ in range(reps))
    return 2.0 * best * threads if best else None


def int8_peak(threads: int, *, reps: int = BANDWIDTH_REPS) -> float | None:
    """int8 ops per second (a multiply-add counts 2, as for float32) at the int8 path's peak on
    ``threads`` cores: the best of ``reps`` runs of the kernels' probe on one core
    (``native.int8_rate``), times ``threads``; None where the probe is absent."""
    from tsspec_gguf import native

    if native.int8_rate(1000, FMA_CHUNKS) is None:  # also the untimed warm-up
        return None
    best = max((native.int8_rate(FMA_ITERS, FMA_CHUNKS) or 0.0) for _ in range(reps))
    return 2.0 * best * threads if best else None


def weight_footprint(target) -> dict:
    """Bytes and multiply-add weights of the matrices reachable from ``target`` (its loaded
    tensors of at most 2 dimensions: dense matrices and vectors, and objects holding block
    tensors, each storage counted once; a tied embedding is one storage, streamed once as the
    output head; a KV cache has more dimensions and is not counted).

    ``bytes``: every reachable tensor's storage; ``weights``: elements of the 2-D matrices (a
    block object's ``shape`` when it has one), which a one-row step multiplies once each."""
    seen_objects: set[int] = set()
    storages: dict[int, int] = {}
    matrices: dict[int, int] = {}

    def visit(obj, depth: int) -> None:
        if depth > 6 or id(obj) in seen_objects or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
            return
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.dim() <= 2:  # weights are matrices and vectors; caches have more dims
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
            return
        if isinstance(obj, dict):
            for value in obj.values():
                visit(value, depth + 1)
            return
        if isinstance(obj, (list, tuple, set, frozenset)):
            for value in obj:
                visit(value, depth + 1)
            return
        names = list(getattr(obj, "__dict__", {}) or {})
        for cls in type(obj).__mro__:
            names += [n for n in getattr(cls, "__slots__", ()) if isinstance(n, str)]
        if not names:
            return
        shape = getattr(obj, "shape", None)
        tensors = [getattr(obj, n, None) for n in names]
        if isinstance(shape, tuple) and len(shape) == 2 and any(isinstance(t, torch.Tensor) for t in tensors):
            matrices[id(obj)] = int(shape[0]) * int(shape[1])  # a block matrix: its logical shape
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    seen_objects.add(id(t))
                    storage = t.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
            return
        for name in names:
            if name in SKIPPED_ATTRIBUTES or name.startswith("__"):
                continue
            value = getattr(obj, name, None)
            if isinstance(value, torch.Tensor) and value.dim() == 2 and value.is_floating_point():
                matrices[value.untyped_storage().data_ptr()] = value.numel()
            if not callable(value) or isinstance(value, torch.Tensor):
                visit(value, depth + 1)

    visit(target, 0)
    return {"bytes": sum(storages.values()), "weights": sum(matrices.values()), "tensors": len(storages)}


def measure_machine(threads: int) -> dict:
    """The machine's two figures, each at 1 and at ``threads`` threads: read bandwidth and
    float32 rate."""
    return {
        "threads": threads,
        "read_bytes_per_s": read_bandwidth(threads, mib=BANDWIDTH_MIB),
        "read_bytes_per_s_1": read_bandwidth(1, mib=BANDWIDTH_MIB),
        "float32_flops_1": float32_rate(1, size=MATMUL_SIZE),
        "float32_flops_n": float32_rate(threads, size=MATMUL_SIZE),
        "fma_peak_flops_n": fma_peak(threads),
        "int8_peak_ops_n": int8_peak(threads),
        "bandwidth_buffer_mib": BANDWIDTH_MIB,
        "matmul_size": MATMUL_SIZE,
    }


def picture(machine: dict, footprint: dict, *, one_row_ms: float | None = None, rows: int = 9,
            rows_ms: float | None = None) -> dict:
    """The floors of a step from the machine's figures and the weights, beside the measured
    one-row (and ``rows``-row) forward when given.

    >>> p = picture({"threads": 2, "read_bytes_per_s": 10e9, "float32_flops_1": 50e9,
    ...              "float32_flops_n": 100e9}, {"bytes": 100e6, "weights": 100e6})
    >>> round(p["stream_ms"], 3), round(p["compute_ms_1"], 3), round(p["compute_ms_k"], 3)
    (10.0, 2.0, 18.0)
    >>> round(p["ratio_floor"], 2)
    1.8
    >>> p8 = picture({"threads": 2, "read_bytes_per_s": 10e9, "float32_flops_1": 50e9,
    ...               "float32_flops_n": 100e9, "int8_peak_ops_n": 200e9}, {"bytes": 100e6, "weights": 100e6})
    >>> round(p8["compute_ms_k_int8"], 3), round(p8["ratio_floor_int8"], 2)
    (9.0, 1.0)
    """
    # the best rates measured: on a shared machine the all-thread figures can come out below the
    # one-thread ones (another process held a core), and a floor must not be raised by that
    bandwidth = max(machine["read_bytes_per_s"], machine.get("read_bytes_per_s_1", 0.0))
    stream_ms = footprint["bytes"] / bandwidth * 1e3
    flops_1 = 2.0 * footprint["weights"]  # one row: a multiply-add per weight
    rate = max(machine["float32_flops_1"], machine["float32_flops_n"], machine.get("fma_peak_flops_n") or 0.0)
    compute_1 = flops_1 / rate * 1e3
    compute_k = rows * flops_1 / rate * 1e3
    floor_1, floor_k = max(stream_ms, compute_1), max(stream_ms, compute_k)
    out = {
        "read_bytes_per_s": bandwidth, "float32_flops": rate,
        "weight_bytes": footprint["bytes"], "weights": footprint["weights"], "rows": rows,
        "stream_ms": stream_ms, "stream_tps": 1e3 / stream_ms,
        "flops_1": flops_1, "flops_k": rows * flops_1, "compute_ms_1": compute_1, "compute_ms_k": compute_k,
        "floor_1_ms": floor_1, "floor_k_ms": floor_k,
        # the lowest k-row / 1-row ratio a float32 kernel can reach here: both steps at their floors
        "ratio_floor": floor_k / floor_1,
    }
    int8 = machine.get("int8_peak_ops_n")
    if int8:  # the same floors with the int8 path's multiply-add peak (its matmuls only)
        c1, ck = flops_1 / int8 * 1e3, rows * flops_1 / int8 * 1e3
        out.update({"int8_ops": int8, "compute_ms_1_int8": c1, "compute_ms_k_int8": ck,
                    "floor_1_ms_int8": max(stream_ms, c1), "floor_k_ms_int8": max(stream_ms, ck),
                    "ratio_floor_int8": max(stream_ms, ck) / max(stream_ms, c1)})
    if one_row_ms:
        out["one_row_ms"] = one_row_ms
        out["one_row_over_floor"] = one_row_ms / floor_1
        # with today's one-row step: the k-row forward cannot cost less than its floor
        out["ratio_floor_vs_measured"] = floor_k / one_row_ms
    if rows_ms:
        out["rows_ms"] = rows_ms
        out["rows_over_floor"] = rows_ms / floor_k
    return out
