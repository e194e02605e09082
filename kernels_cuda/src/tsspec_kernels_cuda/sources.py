"""The CUDA C sources: one ``.cu`` file per kernel family, read as text (no CUDA needed).

``source_text(family)`` inlines the sources' ``#include "..."`` lines (each header once), so a
family compiles with no include path: the same text goes to CuPy's ``RawModule`` on a GPU
machine and to the raw NVRTC binding in the driverless compile test. ``KERNELS`` maps each
registered op to its family and its ``extern "C"`` entry point.
"""

from __future__ import annotations

import re
from importlib import resources

__all__ = ["FAMILIES", "KERNELS", "source_text", "compile_options", "DEFAULT_ARCH"]

FAMILIES = ("gdn_verify", "gdn_commit", "dflash_inject", "dflash_draft_block", "selector_lattice")

# op name -> (family, entry point)
KERNELS = {
    "gdn_verify": ("gdn_verify", "gdn_verify"),
    "gdn_commit": ("gdn_commit", "gdn_commit"),
    "gdn_step": ("gdn_commit", "gdn_step"),
    "dflash_inject": ("dflash_inject", "dflash_inject"),
    "dflash_block_attention": ("dflash_draft_block", "dflash_block_attention"),
    "dflash_grouped_conv": ("dflash_draft_block", "dflash_grouped_conv"),
    "selector_lattice": ("selector_lattice", "selector_lattice"),
}

DEFAULT_ARCH = "compute_90"  # Hopper (H100 / H200); the loader asks the device for its own
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("sources").joinpath(name).read_text(encoding="utf-8")


def source_text(family: str) -> str:
    """The family's source with its local headers inlined (each once, ``#pragma once`` dropped)."""
    if family not in FAMILIES:
        raise KeyError(f"no kernel family {family!r} (known: {', '.join(FAMILIES)})")
    seen: set[str] = set()

    def expand(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        text = _read(name).replace("#pragma once", "")
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(f"{family}.cu")


def compile_options(arch: str | None = DEFAULT_ARCH, *, bf16_weights: bool = False) -> tuple[str, ...]:
    """NVRTC options: the target architecture (None: left to the caller, as CuPy sets it) and
    C++17; no fast math (the torch path is the reference)."""
    options = [f"--gpu-architecture={arch}"] if arch else []
    options.append("--std=c++17")
    if bf16_weights:
        options.append("-DTS_BF16_WEIGHTS")
    return tuple(options)
