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


def _probe_rate(name: str, iters: int, chunks: int, lanes: int) -> float | None:
    """Multiply-adds per CPU second of one core from one run of the kernels' probe ``name``
    (``chunks`` x ``iters`` iterations of FMA_CHAINS independent chains of ``lanes`` each, on one
    thread; CPU time, so another job holding the core does not lower it); None where the kernels,
    their AVX2 path or the probe are absent."""
    module = kernels()
    if module is None or not hasattr(module, name):
        return None
    cpu = time.process_time()
    try:
        getattr(module, name)(iters, chunks, 1)
    except RuntimeError:  # a build or CPU without AVX2
        return None
    seconds = time.process_time() - cpu
    return chunks * iters * FMA_CHAINS * lanes / seconds if seconds > 0 else None


def fma_rate(iters: int, chunks: int) -> float | None:
    """float32 multiply-adds (lanes, not instructions) per CPU second of one core at the fused
    multiply-add peak: the kernels' ``probe_fma`` (see _probe_rate)."""
    return _probe_rate("probe_fma", iters, chunks, FMA_LANES)


def int8_rate(iters: int, chunks: int) -> float | None:
    """int8 multiply-adds per CPU second of one core on the int8 path's instructions (AVX2's
    vpmaddubsw + vpmaddwd, or VNNI's vpdpbusd where the int8 path uses it): the kernels'
    ``probe_int8`` (see _probe_rate)."""
    return _probe_rate("probe_int8", iters, chunks, INT8_LANES)
