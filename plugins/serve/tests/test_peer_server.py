"""The llama-server peer: flags chosen from the CPU, cached by them, never built implicitly."""

from __future__ import annotations

from tsspec_serve import peer_server


def test_flags_follow_the_cpu_and_key_the_cache(monkeypatch, tmp_path):
    avx2 = peer_server.simd_options({"avx", "avx2", "fma", "f16c"})
    assert avx2 == ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
    avx512 = peer_server.simd_options({"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"})
    assert "-DGGML_AVX512=ON" in avx512 and "-DGGML_AVX512_VNNI=ON" in avx512
    assert peer_server.simd_options(set()) == ["-DGGML_NATIVE=OFF"]
    monkeypatch.setenv("TSSPEC_PEER_CACHE", str(tmp_path))
    assert peer_server.cache_dir(avx2) != peer_server.cache_dir(avx512)
    assert peer_server.cache_dir(avx2).parent == tmp_path


def test_not_built_until_asked_then_cached(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TSSPEC_PEER_CACHE", str(tmp_path))
    flags = {"avx", "avx2", "fma", "f16c"}
    monkeypatch.setattr(peer_server, "cpu_flags", lambda cpuinfo=None: flags)
    assert peer_server.cached_binary() is None
    peer_server.main(["--dry-run"])  # prints the commands, builds nothing
    out = capsys.readouterr().out
    assert "--target llama-server" in out and "-DLLAMA_CURL=OFF" in out and "-DGGML_NATIVE=OFF" in out
    assert peer_server.cached_binary() is None
    fake = tmp_path / "built-elsewhere"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    peer_server.main(["--binary", str(fake)])
    assert peer_server.cached_binary() == peer_server.cache_dir(peer_server.simd_options(flags)) / "llama-server"
