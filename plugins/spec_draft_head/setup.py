"""Build hook for the draft head's optional extension (``_head_kernels``: csrc/head.c). It runs on
tsspec-gguf's kernels through their C-API, built by tsspec-gguf's build helper
(``tsspec_gguf/build.py``: the sibling checkout's, else the installed one's). Without a compiler
or the helper the install still succeeds and the head takes its per-call kernels path
(``native_head`` warns once at load)."""

import importlib.util
import runpy
from pathlib import Path

from setuptools import setup

gguf = importlib.util.find_spec("tsspec_gguf")
helpers = [Path(__file__).resolve().parents[1] / "gguf/src/tsspec_gguf/build.py", *([Path(gguf.origin).parent / "build.py"] if gguf and gguf.origin else [])]
build = next((runpy.run_path(str(path)) for path in helpers if path.is_file()), None)
setup(ext_modules=[] if build is None else build["api_extensions"](
    "tsspec_draft_head._head_kernels", ["src/tsspec_draft_head/csrc/head.c"], what="draft-head extension"))
