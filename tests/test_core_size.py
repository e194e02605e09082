"""The core stays the design's small core, counted as ruff format writes it (the version
constraints.txt pins, line length 120 as pyproject.toml sets) on a formatted copy, so that
neither long lines nor dense code hide size; and no C.

The bound is the design's: 6,000 lines."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import tsspec
from ruff.__main__ import find_ruff_bin

CORE = Path(tsspec.__file__).resolve().parent
CEILING = 6000


def formatted_lines(tmp_path: Path) -> dict[str, int]:
    """Lines per core module after ``ruff format`` of a copy."""
    copy = tmp_path / "core"
    shutil.copytree(CORE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    subprocess.run([find_ruff_bin(), "format", "--isolated", "--line-length", "120", "--quiet", str(copy)],
                   check=True)
    return {str(p.relative_to(copy)): len(p.read_text().splitlines()) for p in sorted(copy.rglob("*.py"))}


def test_the_core_is_at_most_the_limit_in_formatted_python(tmp_path):
    lines = formatted_lines(tmp_path)
    largest = sorted(lines.items(), key=lambda kv: -kv[1])[:8]
    total = sum(lines.values())
    assert total <= CEILING, f"core: {total} formatted lines > {CEILING}; largest {largest}"


def test_the_formatter_counts_what_it_formats(tmp_path):
    """A module written on one long line is counted as ruff lays it out, not as one line."""
    source = tmp_path / "core" / "dense.py"
    source.parent.mkdir()
    source.write_text("x = [" + ", ".join(f"'item number {i}'" for i in range(40)) + "]\n")
    subprocess.run([find_ruff_bin(), "format", "--isolated", "--line-length", "120", "--quiet", str(source)],
                   check=True)
    assert len(source.read_text().splitlines()) > 5


def test_the_core_has_no_c():
    assert sorted(str(p.relative_to(CORE)) for p in CORE.rglob("*.[ch]")) == []
