"""Build hook for the toolkit's one compiled part: the CPU kernels (quantised-weight matmul,
attention, row ops, the thread pool), one extension module built from the sources in csrc/.
Optional: without a C compiler the install still succeeds, the kernels are missing, and model
plugins fall back to dense torch matmuls with a one-line warning at load."""

from setuptools import Extension, setup

SOURCES = ["module", "matmul_float", "matmul_int8", "pool", "gemm", "attention", "rowops", "probes", "stack"]

setup(
    ext_modules=[
        Extension(
            "tsspec_gguf._cpu_kernels",
            sources=[f"src/tsspec_gguf/csrc/{name}.c" for name in SOURCES],
            depends=["src/tsspec_gguf/csrc/kernels.h", "src/tsspec_gguf/csrc/kernels_api.h"],
            extra_compile_args=["-O3", "-std=c11", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
