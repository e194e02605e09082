"""What the benchmark ran on: a figure without its machine is not a figure."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1024 * 1024), 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cpu_flags() -> list[str]:
    wanted = ("avx2", "avx512f", "fma", "f16c", "amx_tile")
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return [f for f in wanted if f in flags]
    except OSError:
        pass
    return []


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def describe_machine() -> dict:
    """CPU, cores usable by this process, memory, Python, torch and its thread count, load."""
    import torch

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average": load_average(),
    }


def machine_line(info: dict) -> str:
    """One line for a table caption."""
    mem = f", {info['memory_gib']} GiB" if info.get("memory_gib") else ""
    return (
        f"{info['cpu']} ({info['usable_cpus']} usable cores{mem}), {info['os']}, "
        f"Python {info['python']}, torch {info['torch']} ({info['torch_threads']} threads)"
    )
