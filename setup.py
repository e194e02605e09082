"""Build hook for the one compiled part of the core: the CPU kernels (quantised-weight matmul, attention).

Everything else is in pyproject.toml. The extension is optional: without a C compiler the
install still succeeds and ``tsspec.modeling.qlinear`` falls back to float32 torch matmuls.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tsspec.modeling._cpu_kernels",
            sources=["core/modeling/cpu_kernels.c"],
            extra_compile_args=["-O3", "-std=c11", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
