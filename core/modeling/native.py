"""The compiled CPU kernels (``cpu_kernels.c``, built by setup.py as ``_cpu_kernels``), loaded on
first use. The build is optional: without a C compiler ``kernels()`` is None and callers keep
their torch paths."""

from __future__ import annotations

import time
from types import ModuleType

FMA_LANES = 8  # float32 lanes of one AVX2 register
FMA_CHAINS = 12  # independent FMA chains per probe iteration (PROBE_CHAINS in cpu_kernels.c)
INT8_LANES = 32  # int8 multiply-adds of one 32-byte dot step (probe_int8)

_module: ModuleType | None = None
_checked = False


def kernels() -> ModuleType | None:
    """The extension module, or None when it was not built."""
    global _module, _checked
    if not _checked:
        _checked = True
        try:
            from . import _cpu_kernels  # type: ignore[attr-defined]
        except ImportError:
            _module = None
        else:
            _module = _cpu_kernels
    return _module


def available() -> bool:
    """True when the compiled kernels were built and import."""
    return kernels() is not None


def info() -> dict[str, object]:
    """What the build offers on this CPU: ``{"simd": "avx2+fma" | "scalar" | None, "int8":
    "avx512-vnni" | "avx2" | "scalar" | None, "pool_workers": int}`` (the vector paths are
    chosen at run time by CPU feature; the build itself targets no particular CPU)."""
    module = kernels()
    return {"simd": None, "int8": None, "pool_workers": 0} if module is None else dict(module.info())


def fma_rate(iters: int, chunks: int) -> float | None:
    """float32 multiply-adds (lanes, not instructions) per CPU second of one core at the fused
    multiply-add peak, from one run of the kernels' ``probe_fma`` (``chunks`` x ``iters``
    iterations of independent chains on one thread; CPU time, so another job holding the core
    does not lower it); None where the kernels or their AVX2 path are absent."""
    module = kernels()
    if module is None or not hasattr(module, "probe_fma"):
        return None
    cpu = time.process_time()
    try:
        module.probe_fma(iters, chunks, 1)
    except RuntimeError:  # a build without AVX2 + FMA
        return None
    seconds = time.process_time() - cpu
    return chunks * iters * FMA_CHAINS * FMA_LANES / seconds if seconds > 0 else None


def int8_rate(iters: int, chunks: int) -> float | None:
    """int8 multiply-adds per CPU second of one core on the int8 path's instructions (AVX2's
    vpmaddubsw + vpmaddwd, or VNNI's vpdpbusd where the int8 path uses it), from one run of the
    kernels' ``probe_int8`` (``chunks`` x ``iters`` steps of independent accumulators on one
    thread, CPU time); None where the kernels, their AVX2 path or the probe are absent."""
    module = kernels()
    if module is None or not hasattr(module, "probe_int8"):
        return None
    cpu = time.process_time()
    try:
        module.probe_int8(iters, chunks, 1)
    except RuntimeError:  # a build without AVX2
        return None
    seconds = time.process_time() - cpu
    return chunks * iters * FMA_CHAINS * INT8_LANES / seconds if seconds > 0 else None
