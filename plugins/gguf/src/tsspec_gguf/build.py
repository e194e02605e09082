"""Build helpers for plugins whose extensions run on these kernels through their C-API
(``csrc/kernels_api.h``, a capsule imported at module init). Standalone: a plugin's setup.py
loads this file by path (``runpy``), without importing tsspec or this package (an isolated build
has neither)."""

from __future__ import annotations

import sys
from pathlib import Path

HEADER = "kernels_api.h"


def include_dir() -> str | None:
    """The folder holding ``kernels_api.h`` (this file's own csrc/), or None."""
    here = Path(__file__).resolve().parent / "csrc"
    return str(here) if (here / HEADER).is_file() else None


def api_extensions(name: str, sources: list[str], *, depends: list[str] = (), what: str = "extension") -> list:
    """The optional extension ``name`` built from ``sources`` on the kernels' C-API, as a list for
    ``setup(ext_modules=...)``: empty, with a warning naming ``what``, when the header is missing."""
    from setuptools import Extension

    include = include_dir()
    if include is None:
        print(f"warning: tsspec-gguf's {HEADER} not found; the {what} is not built", file=sys.stderr)
        return []
    return [Extension(name, sources=sources, include_dirs=[include], depends=[f"{include}/{HEADER}", *depends],
                      extra_compile_args=["-O3", "-std=c11"], optional=True)]
