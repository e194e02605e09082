"""Build helpers for plugins whose extensions run on these kernels through their C-API
(``csrc/kernels_api.h``, a capsule imported at module init). Standalone: a plugin's setup.py
loads this file by path, without importing tsspec or this package (an isolated build has neither)."""

from __future__ import annotations

from pathlib import Path

HEADER = "kernels_api.h"


def include_dir() -> str | None:
    """The folder holding ``kernels_api.h`` (this file's own csrc/), or None."""
    here = Path(__file__).resolve().parent / "csrc"
    return str(here) if (here / HEADER).is_file() else None

