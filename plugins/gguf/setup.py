"""Build hook for the toolkit's one compiled part: the CPU kernels (quantised-weight matmul,
attention). Optional: without a C compiler the install still succeeds, the kernels are missing,
and model plugins fall back to dense torch matmuls with a one-line warning at load."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tsspec_gguf._cpu_kernels",
            sources=["src/tsspec_gguf/cpu_kernels.c"],
            extra_compile_args=["-O3", "-std=c11", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
