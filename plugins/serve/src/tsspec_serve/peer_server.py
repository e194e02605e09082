"""The serving peer: llama.cpp's own multi-slot ``llama-server``, built here and cached.

Built from the llama.cpp source that llama-cpp-python's source distribution carries (the same
pinned version as the bench's peer wheel), the ``llama-server`` target only, statically linked,
with SIMD flags chosen from this CPU's own flag list (AVX-512 where it has it, else AVX2 with
FMA and F16C, else AVX, else none; never ``GGML_NATIVE``). The binary is cached under
``~/.cache/tsspec/peers/llama-server-<key>/`` (``TSSPEC_PEER_CACHE`` moves it), keyed on those
flags and the version: a machine with another instruction set builds its own. Nothing builds it
implicitly: ``bench-serve`` runs it when the cache holds it and says "not built" otherwise.

    python -m tsspec_serve.peer_server [--sdist PATH | --source DIR | --binary PATH] [--jobs N] [--dry-run]

(``--binary`` caches a ``llama-server`` built elsewhere with exactly these flags.)

``serve_levels`` runs it at each stream count N as ``llama-server --parallel N`` (N slots, one
batch per step) and sends N requests at once: aggregate tok/s, as the streams section measures.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tsspec_bench.peer_build import cmake_options as simd_options, cpu_flags  # the same SIMD choice as the peer wheel

VERSION = "0.3.36"  # llama-cpp-python's sdist carries the llama.cpp source; constraints.txt pins the same
PACKAGE = "llama-cpp-python"
BINARY = "llama-server"
FIXED = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
         "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]


def cache_dir(options: Sequence[str], version: str = VERSION) -> Path:
    root = Path(os.environ.get("TSSPEC_PEER_CACHE") or Path.home() / ".cache" / "tsspec" / "peers")
    key = hashlib.sha256(" ".join([BINARY, version, *sorted(options)]).encode()).hexdigest()[:16]
    return root / f"{BINARY}-{key}"


def cached_binary(flags: set[str] | None = None) -> Path | None:
    """The cached ``llama-server`` for this CPU's flags, or None when it was not built."""
    path = cache_dir(simd_options(cpu_flags() if flags is None else flags)) / BINARY
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _run(cmd: list[str], dry_run: bool, cwd: str | None = None) -> None:
    print(f"peer server build: {' '.join(cmd)}", flush=True)
    if not dry_run:
        subprocess.run(cmd, check=True, cwd=cwd)


def build(*, sdist: str | None = None, source: str | None = None, binary: str | None = None, jobs: int = 2,
          dry_run: bool = False) -> Path:
    """Build ``llama-server`` from llama-cpp-python's sdist (downloaded with pip unless given)
    or from a llama.cpp source tree (or take ``binary``), and cache it for this CPU's flags;
    the cached path."""
    options = simd_options(cpu_flags())
    folder = cache_dir(options)
    print(f"peer server build: CPU flags -> {' '.join(options)} (cache {folder})", flush=True)
    if binary is not None:
        if not dry_run:
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy2(binary, folder / BINARY)
            (folder / "cmake_args.txt").write_text(" ".join([*FIXED, *options]) + "\n")
        return folder / BINARY
    with tempfile.TemporaryDirectory() as tmp:
        if source is None:
            if sdist is None:
                _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", tmp,
                      f"{PACKAGE}=={VERSION}"], dry_run)
                found = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
                sdist = str(found[0]) if found else f"{tmp}/llama_cpp_python-{VERSION}.tar.gz"
            if not dry_run:
                with tarfile.open(sdist) as archive:
                    archive.extractall(tmp, filter="data")
            source = str(Path(tmp) / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp")
        out = str(Path(tmp) / "build")
        _run(["cmake", "-S", source, "-B", out, *FIXED, *options], dry_run)
        _run(["cmake", "--build", out, "--target", BINARY, "-j", str(jobs)], dry_run)
        if dry_run:
            return folder / BINARY
        built = Path(out) / "bin" / BINARY
        if not built.is_file():
            raise SystemExit(f"peer server build: the build produced no {built}")
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, folder / BINARY)
        (folder / "cmake_args.txt").write_text(" ".join([*FIXED, *options]) + "\n")
    return folder / BINARY


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(port: int, path: str, body: dict, timeout: float = 600.0) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"llama-server answered {response.status}: {data[:200]!r}")
        return json.loads(data)
    finally:
        conn.close()


def _wait_ready(proc: subprocess.Popen, port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode} before it was ready")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("llama-server was not ready within two minutes")


def serve_levels(binary: str | Path, model_path: str, prompts: Sequence[Sequence[int]], levels: Sequence[int],
                 max_tokens: int, threads: int, slot_context: int = 2048) -> dict[str, Any]:
    """Per level N: a fresh ``llama-server --parallel N`` (``slot_context`` positions a slot),
    one warm-up request, then the first N prompts at once (greedy, no prompt cache);
    aggregate tok/s over the wall time from submission to the last answer."""
    out = []
    for n in sorted(levels):
        port = _free_port()
        cmd = [str(binary), "-m", model_path, "--host", "127.0.0.1", "--port", str(port), "--parallel", str(n),
               "-c", str(slot_context * n), "--threads", str(threads), "--threads-batch", str(threads),
               "-ngl", "0", "--no-webui"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _wait_ready(proc, port)
            body = {"n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False, "seed": 0}
            _post(port, "/completion", {**body, "prompt": list(prompts[0][:8]), "n_predict": 2})
            replies: list[Any] = [None] * n

            def ask(i: int) -> None:
                try:
                    replies[i] = _post(port, "/completion", {**body, "prompt": list(prompts[i])})
                except Exception as exc:  # noqa: BLE001 - reported below
                    replies[i] = exc

            workers = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
            start = time.perf_counter()
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            wall = time.perf_counter() - start
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
            tokens = sum(int(r.get("tokens_predicted", r.get("timings", {}).get("predicted_n", 0))) for r in replies)
            out.append({"streams": n, "tok_s": tokens / wall, "tokens": tokens})
        except Exception as exc:  # noqa: BLE001 - the bench prints why the peer did not run
            proc.terminate()
            tail = (proc.communicate(timeout=10)[1] or "").strip().splitlines()
            return {"error": f"llama-server --parallel {n}: {exc}" + (f" ({tail[-1]})" if tail else "")}
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return {"binary": str(binary), "levels": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", help="llama-cpp-python's sdist (.tar.gz); default: pip downloads it")
    parser.add_argument("--source", help="a llama.cpp source tree to build instead of the sdist's")
    parser.add_argument("--binary", help="a llama-server built elsewhere with exactly these flags: cache it")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    parser.add_argument("--dry-run", action="store_true", help="print the flags and commands, build nothing")
    args = parser.parse_args(argv)
    path = build(sdist=args.sdist, source=args.source, binary=args.binary, jobs=args.jobs, dry_run=args.dry_run)
    print(f"peer server build: {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
