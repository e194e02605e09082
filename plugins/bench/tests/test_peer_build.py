"""tsspec_bench.peer_build: the llama.cpp peer's SIMD flags come from the CPU's flag list, never
GGML_NATIVE, and the built wheel is cached per flag set."""

from __future__ import annotations

from tsspec_bench import peer_build

ZEN3 = "processor : 0\nflags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2\n"
ZEN4 = ZEN3.replace("bmi2", "bmi2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16")


def test_avx2_machine_gets_the_avx2_set():
    options = peer_build.cmake_options(peer_build.cpu_flags(ZEN3))
    assert options == ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]


def test_avx512_vnni_machine_gets_avx512_and_vnni():
    options = peer_build.cmake_options(peer_build.cpu_flags(ZEN4))
    assert "-DGGML_AVX512=ON" in options and "-DGGML_AVX512_VNNI=ON" in options and "-DGGML_AVX512_BF16=ON" in options
    assert options[0] == "-DGGML_NATIVE=OFF" and not any("NATIVE=ON" in o for o in options)


def test_no_simd_flags_builds_a_plain_one():
    assert peer_build.cmake_options(set()) == ["-DGGML_NATIVE=OFF"]


def test_the_cache_is_keyed_on_the_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("TSSPEC_PEER_CACHE", str(tmp_path))
    avx2 = peer_build.cmake_options(peer_build.cpu_flags(ZEN3))
    avx512 = peer_build.cmake_options(peer_build.cpu_flags(ZEN4))
    assert peer_build.cache_dir(avx2) != peer_build.cache_dir(avx512)
    assert peer_build.cache_dir(avx2) == peer_build.cache_dir(list(reversed(avx2)))


def test_a_seeded_wheel_is_reused_and_a_dry_run_builds_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TSSPEC_PEER_CACHE", str(tmp_path / "cache"))
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(ZEN3)
    wheel = tmp_path / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    options = peer_build.cmake_options(peer_build.cpu_flags(ZEN3))
    cached = peer_build.ensure_wheel(options, python="python", seed=str(wheel))
    assert cached.read_bytes() == wheel.read_bytes() and cached.parent == peer_build.cache_dir(options)
    assert (cached.parent / "cmake_args.txt").read_text().split() == options
    assert peer_build.main(["--cpuinfo", str(cpuinfo), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"reusing {cached}" in out and "pip install" in out and "pip wheel" not in out
    empty = tmp_path / "other"
    monkeypatch.setenv("TSSPEC_PEER_CACHE", str(empty))
    assert peer_build.main(["--cpuinfo", str(cpuinfo), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX=ON" in out and "pip wheel --no-deps" in out and not empty.exists()
