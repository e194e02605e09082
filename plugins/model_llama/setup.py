"""Build hook for llama's optional fused-step extension (``_step_kernels``: csrc/step.c, and
csrc/family.c for the families whose block is not llama's). It runs
on tsspec-gguf's kernels through their C-API (``kernels_api.h``, a capsule imported at module
init), so it needs that header at build time: the sibling checkout's, else the installed
tsspec-gguf's. Without a compiler or the header the install still succeeds and the target takes
its per-stack path (``native_step`` warns once at load)."""

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup


def api_include() -> str | None:
    """The folder holding tsspec-gguf's ``kernels_api.h`` (its build helper, ``tsspec_gguf/build.py``,
    found beside this plugin in a checkout, else installed), or None."""
    sibling = Path(__file__).resolve().parent.parent / "gguf" / "src" / "tsspec_gguf" / "build.py"
    found = importlib.util.find_spec("tsspec_gguf") if not sibling.is_file() else None
    path = sibling if sibling.is_file() else Path(found.origin).parent / "build.py" if found and found.origin else None
    if path is None or not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("tsspec_gguf_build", path)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build.include_dir()


include = api_include()
if include is None:
    print("tsspec-model-llama: warning: tsspec-gguf's kernels_api.h not found; the fused-step "
          "extension is not built", file=sys.stderr)
setup(
    ext_modules=[] if include is None else [
        Extension(
            "tsspec_model_llama._step_kernels",
            sources=["src/tsspec_model_llama/csrc/step.c", "src/tsspec_model_llama/csrc/family.c"],
            include_dirs=[include],
            depends=[f"{include}/kernels_api.h", "src/tsspec_model_llama/csrc/family.h"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        )
    ]
)
