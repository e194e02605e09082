"""The compiled CPU kernels (``csrc/*.c``, built by setup.py as ``_cpu_kernels``), loaded on
first use, and the plugins' own extensions built on their C-API (``extension``). The builds are
optional: without a C compiler ``kernels()`` is None and callers keep their torch paths."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING

from tsspec.switches import switch_on

if TYPE_CHECKING:
    import torch

FMA_LANES = 8  # float32 lanes of one AVX2 register
FMA_CHAINS = 12  # independent FMA chains per probe iteration (PROBE_CHAINS in cpu_kernels.c)
INT8_LANES = 32  # int8 multiply-adds of one 32-byte dot step (probe_int8)
# byte ranges less than this far apart are one range for huge_pages (an allocator's headers and
# alignment padding between two tensors; all of it this process's own memory: a gap of a whole
# page may be unmapped, and madvise would refuse the joined range)
PAGE_GAP = 4096

_module: ModuleType | None = None
_checked = False


def forced_off(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TSSPEC_NATIVE`` turns the compiled kernels off (``0``/``false``/``no``/``off``):
    every caller then takes its torch path, as on a machine without a C compiler.

    >>> forced_off({"TSSPEC_NATIVE": "off"}), forced_off({})
    (True, False)
    """
    return not switch_on("TSSPEC_NATIVE", environ)


def kernels() -> ModuleType | None:
    """The extension module, or None when it was not built (or ``TSSPEC_NATIVE=0``)."""
    global _module, _checked
    if not _checked:
        _checked = True
        if forced_off():
            _module = None
            return None
        try:
            from . import _cpu_kernels  # type: ignore[attr-defined]
        except ImportError:
            _module = None
        else:
            _module = _cpu_kernels
    return _module


_extensions: dict[str, ModuleType | None] = {}
_extension_warned: set[str] = set()


def extension(name: str) -> ModuleType | None:
    """A plugin's extension built on these kernels' C-API (``kernels_api.h``; e.g.
    ``"tsspec_model_llama._step_kernels"``), imported once; None where the kernels are missing
    or forced off, or the extension did not build (see ``warn_missing_extension``)."""
    if name not in _extensions:
        module = None
        if kernels() is not None:
            import importlib

            try:
                module = importlib.import_module(name)
            except ImportError:
                module = None
        _extensions[name] = module
    return _extensions[name]


def warn_missing_extension(name: str, what: str) -> None:
    """One line on stderr, once per process and extension, when the kernels are there but the
    plugin's extension ``name`` is not, so ``what`` takes a slower path: never silently."""
    if name in _extension_warned or kernels() is None or extension(name) is not None:
        return
    _extension_warned.add(name)
    print(f"tsspec: warning: {what} runs without its compiled extension {name} (it did not build "
          "or import; slower, same values)", file=sys.stderr)


def load_build(path: str) -> ModuleType:
    """Another build of the kernels (a ``_cpu_kernels*.so`` at ``path``, e.g. main's), loaded
    beside the installed one: the A side of the A/B scripts."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_cpu_kernels", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no kernels build at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_warned = False


def warn_fallback(what: str) -> None:
    """One line on stderr, once per process, when ``what`` takes the torch path because the
    compiled kernels are missing or forced off: a slower path is never taken silently."""
    global _warned
    if _warned or available():
        return
    _warned = True
    why = "TSSPEC_NATIVE=0" if forced_off() else "the compiled CPU kernels did not build or import"
    print(f"tsspec: warning: {what} runs dense float32 torch matmuls ({why}; slower, "
          "and not row-count invariant)", file=sys.stderr)


def available() -> bool:
    """True when the compiled kernels were built and import."""
    return kernels() is not None


def info() -> dict[str, object]:
    """What the build offers on this CPU: ``{"simd": "avx2+fma" | "scalar" | None, "int8":
    "avx512-vnni" | "avx2" | "scalar" | None, "pool_workers": int}`` (the vector paths are
    chosen at run time by CPU feature; the build itself targets no particular CPU)."""
    module = kernels()
    return {"simd": None, "int8": None, "pool_workers": 0} if module is None else dict(module.info())


def probes() -> ModuleType | None:
    """The roofline probes' build (``_cpu_probes``: the kernels plus ``probe_fma``,
    ``probe_read``, ``probe_int8``), installed only with ``TSSPEC_BUILD_PROBES=1``; else None."""
    if kernels() is None:
        return None
    try:
        from . import _cpu_probes  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _cpu_probes


def _probe_rate(name: str, iters: int, chunks: int, lanes: int) -> float | None:
    """Multiply-adds per CPU second of one core from one run of the probe ``name`` (``chunks``
    x ``iters`` iterations of FMA_CHAINS independent chains of ``lanes`` each, on one thread;
    CPU time, so another job holding the core does not lower it); None where the probes'
    build (``probes()``) or its AVX2 path are absent."""
    module = probes()
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


def byte_ranges(tensors: Iterable[torch.Tensor], gap: int = PAGE_GAP) -> list[tuple[int, int]]:
    """The [start, end) byte addresses the tensors' storage spans, sorted, those less than
    ``gap`` bytes apart (or overlapping: views of one tensor) joined into one."""
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors if t.numel() > 0
    )
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start < merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def huge_pages(tensors: Iterable[torch.Tensor], *, collapse: bool = True) -> int:
    """Back the memory of CPU tensors that a step streams (a model's weights) with 2 MiB pages
    where the system allows it: fewer TLB misses per byte streamed, the same bytes (no value
    changes). ``collapse`` moves pages already written into huge pages now (Linux
    6.1+); without it only pages touched later take them (for memory not yet written: it stays
    uncommitted). Returns the bytes advised; 0 without the kernels, off Linux, where the system
    refuses, or with the kernels' ``set_huge_pages(False)``.

    The collapse runs at load and costs ~1.5 ms a MB on the development machine (~0.2 s for the
    embedded model; a multi-GB model pays seconds). On a file mapping (``WeightCache(mode=
    "mmap")``) it reads the mapped bytes in, so the lazy mapping's saving is gone."""
    module = kernels()
    if module is None or not hasattr(module, "advise_huge_pages"):
        return 0
    return sum(module.advise_huge_pages(start, end - start, collapse) for start, end in byte_ranges(tensors))
