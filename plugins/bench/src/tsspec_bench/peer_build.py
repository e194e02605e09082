"""The llama.cpp peer's build: llama-cpp-python compiled with SIMD flags chosen from this CPU.

A "native" build (``GGML_NATIVE=ON``) has died with "Illegal instruction" on these machines, so
the flags are explicit and chosen from the CPU's own flag list (``/proc/cpuinfo``, what ``lscpu``
prints): AVX-512 (F, BW, VL; plus VNNI and BF16 when present) where the CPU has it, else AVX2
(with FMA, F16C, and AVX-VNNI when present), else AVX, else none. tsspec's int8 path uses
AVX-512 VNNI where the CPU has it; the peer gets the same instructions.

The built wheel is cached under ``~/.cache/tsspec/peers/<key>/`` (``TSSPEC_PEER_CACHE`` moves
it), keyed on the chosen flags and the pinned version: a machine with another instruction set
builds its own, one with the same reuses it. ``--wheel PATH`` seeds the cache with a wheel
built elsewhere with exactly these flags.

    python -m tsspec_bench.peer_build [--wheel PATH] [--dry-run]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # constraints.txt pins the same
PACKAGE = "llama-cpp-python"

# (ggml option, the CPU flags it needs): in order, each level a superset of the next one's base
AVX512 = [("GGML_AVX512", {"avx512f", "avx512bw", "avx512vl"}), ("GGML_AVX512_VNNI", {"avx512_vnni"}),
          ("GGML_AVX512_BF16", {"avx512_bf16"})]
AVX2 = [("GGML_AVX2", {"avx2"}), ("GGML_FMA", {"fma"}), ("GGML_F16C", {"f16c"}), ("GGML_AVX_VNNI", {"avx_vnni"})]


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The flags of the first processor in ``/proc/cpuinfo`` (or the given text)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            return set(line.split(":", 1)[1].split())
    return set()


def cmake_options(flags: set[str]) -> list[str]:
    """``-DGGML_...`` options for a CPU with ``flags``; GGML_NATIVE is always OFF."""
    on: list[str] = []
    if AVX512[0][1] <= flags:
        on = ["GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C"]
        on += [name for name, need in AVX512 if need <= flags]
    elif "avx2" in flags:
        on = ["GGML_AVX"] + [name for name, need in AVX2 if need <= flags]
    elif "avx" in flags:
        on = ["GGML_AVX"]
    return ["-DGGML_NATIVE=OFF"] + [f"-D{name}=ON" for name in on]


def cache_key(options: list[str], version: str = VERSION) -> str:
    return hashlib.sha256(" ".join([PACKAGE, version, *sorted(options)]).encode()).hexdigest()[:16]


def cache_dir(options: list[str]) -> Path:
    root = Path(os.environ.get("TSSPEC_PEER_CACHE") or Path.home() / ".cache" / "tsspec" / "peers")
    return root / cache_key(options)


def _run(cmd: list[str], env: dict | None, dry_run: bool) -> None:
    prefix = f"CMAKE_ARGS={shlex.quote(env['CMAKE_ARGS'])} " if env and "CMAKE_ARGS" in env else ""
    print(f"peer build: {prefix}{shlex.join(cmd)}", flush=True)
    if not dry_run:
        subprocess.run(cmd, check=True, env=env)


def ensure_wheel(options: list[str], *, python: str, seed: str | None = None, dry_run: bool = False) -> Path:
    """The cached wheel for these options: seeded from ``seed``, built once, or reused."""
    folder = cache_dir(options)
    wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    if wheels and not seed:
        print(f"peer build: reusing {wheels[-1]} ({' '.join(options)})", flush=True)
        return wheels[-1]
    if not dry_run:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cmake_args.txt").write_text(" ".join(options) + "\n")
    if seed:
        target = folder / Path(seed).name
        print(f"peer build: caching {seed} as the build for {' '.join(options)}", flush=True)
        if not dry_run:
            shutil.copy2(seed, target)
        return target
    env = {**os.environ, "CMAKE_ARGS": " ".join(options), "FORCE_CMAKE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        _run([python, "-m", "pip", "wheel", "--no-deps", "--no-binary", PACKAGE, "-w", tmp,
              f"{PACKAGE}=={VERSION}"], env, dry_run)
        built = sorted(Path(tmp).glob("llama_cpp_python-*.whl"))
        if dry_run:
            return folder / f"llama_cpp_python-{VERSION}-(built).whl"
        if not built:
            raise SystemExit(f"peer build: pip wheel produced no {PACKAGE} wheel")
        shutil.copy2(built[0], folder / built[0].name)
        return folder / built[0].name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", help="a wheel built elsewhere with exactly these flags: cache it and install it")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose environment gets the peer")
    parser.add_argument("--cpuinfo", help="read CPU flags from this file instead of /proc/cpuinfo")
    parser.add_argument("--dry-run", action="store_true", help="print the flags and commands, build nothing")
    args = parser.parse_args(argv)
    flags = cpu_flags(Path(args.cpuinfo).read_text() if args.cpuinfo else None)
    options = cmake_options(flags)
    print(f"peer build: CPU flags -> {' '.join(options)} (cache {cache_dir(options)})", flush=True)
    wheel = ensure_wheel(options, python=args.python, seed=args.wheel, dry_run=args.dry_run)
    _run([args.python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel),
          "diskcache==5.6.3"], None, args.dry_run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
