"""Build hook for llama's optional fused-step extension (``_step_kernels``: csrc/step.c, and
csrc/family.c for the families whose block is not llama's). It runs on tsspec-gguf's kernels
through their C-API, built by tsspec-gguf's build helper (``tsspec_gguf/build.py``: the sibling
checkout's, else the installed one's). Without a compiler or the helper the install still
succeeds and the target takes its per-stack path (``native_step`` warns once at load)."""

import importlib.util
import runpy
from pathlib import Path

from setuptools import setup

gguf = importlib.util.find_spec("tsspec_gguf")
helpers = [Path(__file__).resolve().parents[1] / "gguf/src/tsspec_gguf/build.py", *([Path(gguf.origin).parent / "build.py"] if gguf and gguf.origin else [])]
build = next((runpy.run_path(str(path)) for path in helpers if path.is_file()), None)
setup(ext_modules=[] if build is None else build["api_extensions"](
    "tsspec_model_llama._step_kernels",
    ["src/tsspec_model_llama/csrc/step.c", "src/tsspec_model_llama/csrc/family.c"],
    depends=["src/tsspec_model_llama/csrc/family.h"], what="fused-step extension"))
