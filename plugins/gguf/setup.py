"""Build hook for the toolkit's one compiled part: the CPU kernels (quantised-weight matmul,
attention, row ops, the thread pool), one extension module built from the sources in csrc/.
Optional: without a C compiler the install still succeeds, the kernels are missing, and model
plugins fall back to dense torch matmuls with a one-line warning at load.

The roofline probes (``csrc/probes.c``: a CPU's multiply-add peak and read bandwidth, for the
bench's verify-cost bound and ``plugins/model_llama/scripts/roofline.py``) are not part of the
production extension: ``TSSPEC_BUILD_PROBES=1`` at install also builds ``tsspec_gguf._cpu_probes``
(the same kernels plus the probes)."""

import os

from setuptools import Extension, setup

SOURCES = ["module", "matmul_float", "matmul_half", "matmul_int8", "pool", "gemm", "attention", "rowops", "stack"]


def kernels_extension(name: str, sources: list[str], macros: list[tuple[str, str]]) -> Extension:
    return Extension(
        name,
        sources=[f"src/tsspec_gguf/csrc/{source}.c" for source in sources],
        depends=["src/tsspec_gguf/csrc/kernels.h", "src/tsspec_gguf/csrc/kernels_api.h"],
        define_macros=macros,
        extra_compile_args=["-O3", "-std=c11", "-pthread"],
        extra_link_args=["-pthread"],
        optional=True,
    )


extensions = [kernels_extension("tsspec_gguf._cpu_kernels", SOURCES, [])]
if os.environ.get("TSSPEC_BUILD_PROBES", "").strip() == "1":
    extensions.append(kernels_extension("tsspec_gguf._cpu_probes", [*SOURCES, "probes"], [("TSSPEC_PROBES", "1")]))

setup(ext_modules=extensions)
