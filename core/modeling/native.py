"""The compiled CPU kernels (``cpu_kernels.c``, built by setup.py as ``_cpu_kernels``), loaded on
first use. The build is optional: without a C compiler ``kernels()`` is None and callers keep
their torch paths."""

from __future__ import annotations

from types import ModuleType

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
