"""Loading the kernels on a device: CuPy ``RawModule`` per family, compiled by NVRTC at first
use and cached per (family, architecture, weight type) for the life of the process.

Nothing here imports CuPy at import time. ``probe()`` says whether kernels can run at all (CuPy
importable, a CUDA device present) and why not; the plugin registers its ops as unavailable
with that reason otherwise, so the rest of tsspec installs and runs without CuPy or a GPU.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs

from .sources import KERNELS, compile_options, source_text

__all__ = ["DeviceProbe", "probe", "KernelLoader", "LOADER"]


@attrs.frozen
class DeviceProbe:
    """Whether the kernels can run here: ``available`` with the device's name, or the reason."""

    available: bool
    reason: str = ""
    device: str = ""
    arch: str = ""  # compute_XY of device 0

    def describe(self) -> str:
        return f"device {self.device} ({self.arch})" if self.available else f"unavailable: {self.reason}"


def probe() -> DeviceProbe:
    """Look for CuPy and a CUDA device without raising (every failure becomes a reason)."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CuPy built for another CUDA
        return DeviceProbe(False, f"CuPy is not importable ({type(exc).__name__}: {exc}); "
                                  "install cupy-cuda12x or cupy-cuda13x")
    try:
        from cupy.cuda import runtime

        count = runtime.getDeviceCount()
    except Exception as exc:
        return DeviceProbe(False, f"no CUDA driver or device ({type(exc).__name__}: {exc})")
    if count < 1:
        return DeviceProbe(False, "no CUDA device found")
    try:
        props = runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        arch = f"compute_{props['major']}{props['minor']}"
    except Exception as exc:
        return DeviceProbe(False, f"cannot read the CUDA device's properties ({type(exc).__name__}: {exc})")
    return DeviceProbe(True, "", name, arch)


class KernelLoader:
    """Compiled modules and functions by name, built on first use (thread-safe, cached)."""

    def __init__(self) -> None:
        self._modules: dict[tuple[str, str, bool], Any] = {}
        self._functions: dict[tuple[str, str, bool], Any] = {}
        self._lock = threading.Lock()
        self._arch: str | None = None
        self.compiled: list[str] = []  # families compiled so far, for stats and the device check

    def arch(self) -> str:
        if self._arch is None:
            import cupy

            self._arch = f"compute_{cupy.cuda.Device().compute_capability}"  # e.g. "90"
        return self._arch

    def function(self, op: str, *, bf16_weights: bool = False):
        """The compiled entry point of ``op`` (see ``sources.KERNELS``)."""
        family, entry = KERNELS[op]
        key = (op, self.arch(), bf16_weights)
        fn = self._functions.get(key)
        if fn is None:
            with self._lock:
                module = self._module(family, bf16_weights)
                fn = self._functions.setdefault(key, module.get_function(entry))
        return fn

    def _module(self, family: str, bf16_weights: bool):
        import cupy

        key = (family, self.arch(), bf16_weights)
        module = self._modules.get(key)
        if module is None:
            # CuPy names the device's own architecture; the families with a grid barrier are
            # launched with at most one block per multiprocessor (see ops.resident_blocks)
            module = cupy.RawModule(
                code=source_text(family),
                options=compile_options(None, bf16_weights=bf16_weights),
                backend="nvrtc",
            )
            module.compile()
            self._modules[key] = module
            self.compiled.append(f"{family}{'[bf16]' if bf16_weights else ''}")
        return module


LOADER = KernelLoader()
