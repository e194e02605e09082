"""Every kernel family compiles for Hopper (compute_90) through NVRTC, without a GPU or driver:
the raw NVRTC binding (createProgram / compileProgram / getPTX) needs only the NVRTC library."""

from __future__ import annotations

import re

import pytest

from tsspec_kernels_cuda.sources import FAMILIES, KERNELS, compile_options, source_text


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()  # loads libnvrtc
    except Exception as exc:  # no CuPy wheel, or no NVRTC library for it
        pytest.skip(f"the NVRTC binding cannot load here ({type(exc).__name__}: {exc}); "
                    "pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12")
    return nvrtc


def _ptx(nvrtc, family: str, *, bf16: bool) -> str:
    prog = nvrtc.createProgram(source_text(family), f"{family}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(compile_options("compute_90", bf16_weights=bf16)))
        except Exception as exc:
            pytest.fail(f"{family} does not compile: {exc}\n{nvrtc.getProgramLog(prog)}")
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


@pytest.mark.parametrize("bf16", [False, True], ids=["f32-weights", "bf16-weights"])
@pytest.mark.parametrize("family", FAMILIES)
def test_family_compiles_for_compute_90(family, bf16):
    ptx = _ptx(_nvrtc(), family, bf16=bf16)
    assert ".target sm_90" in ptx
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    wanted = {entry for fam, entry in KERNELS.values() if fam == family}
    assert wanted <= entries, f"{family}: missing entry points {wanted - entries}"


def test_broken_source_is_reported():
    """The check can fail: a syntax error is a compile error, not a pass."""
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram('extern "C" __global__ void broken() { int x = ; }', "broken.cu", [], [])
    try:
        with pytest.raises(Exception):
            nvrtc.compileProgram(prog, ["--gpu-architecture=compute_90"])
    finally:
        nvrtc.destroyProgram(prog)


def test_sources_inline_their_headers_once():
    for family in FAMILIES:
        text = source_text(family)
        assert '#include "' not in text
        assert text.count("__device__ __forceinline__ float warp_sum") == 1


def test_every_op_names_a_family():
    assert {fam for fam, _ in KERNELS.values()} == set(FAMILIES)
    with pytest.raises(KeyError):
        source_text("nope")
