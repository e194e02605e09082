"""``load_muse_glimmer(gguf_path, options)``: the loader registered for ``muse-glimmer`` files.

Dtype: float32 (default; CPU, on the compiled block kernels when they are built: every matrix
kept in the file's quantised blocks, batch-invariant rows) or float64 (the exact reference mode
for tests, torch ops). ``--dtype float32`` asks for dense float32 matrices. Device: ``cpu``, or
``cuda[:N]`` where torch has CUDA (dense weights, torch ops on the device).

A DFlash assistant is attached at load when the environment names one
(``TS_MUSE_GLIMMER_DFLASH=PATH``) or when the target's own file carries it (``assistant.py``).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf import native
from tsspec_gguf.cache import WeightCache
from tsspec_gguf.gguf_file import GGUFFile
from tsspec_gguf.tokenizer import from_gguf

from .assistant import attach_at_load
from .hparams import ARCH, read_hparams
from .target import MuseGlimmerTarget
from .weights import load_weights

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
          "float64": torch.float64, "fp64": torch.float64}


def _setting(options: Any, name: str) -> Any:
    if options is None:
        return None
    if isinstance(options, Mapping):
        return options.get(name)
    return getattr(options, name, None)


def load_muse_glimmer(gguf_path: str | os.PathLike[str], options: Any = None) -> MuseGlimmerTarget:
    """Open, check and load a Muse-Glimmer GGUF. Every problem is a ModelLoadError."""
    path = os.fspath(gguf_path)
    text = str(_setting(options, "device") or "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ModelLoadError(path, f"--device {text!r} is not a torch device") from None
    if device.type not in ("cpu", "cuda"):
        raise ModelLoadError(path, f"--device {text}: the muse-glimmer plugin runs on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(path, f"--device {text}: torch has no CUDA device here")
    requested = _setting(options, "dtype")
    if requested in (None, "auto"):
        dtype = torch.float32
    else:
        dtype = DTYPES.get(str(requested).lower().removeprefix("torch."))
        if dtype is None:
            raise ModelLoadError(path, f"--dtype {requested!r} is not supported (use float32 or float64)")
    blocks = requested in (None, "auto") and native.available() and device.type == "cpu"
    if requested in (None, "auto") and device.type == "cpu" and not blocks:
        native.warn_fallback(path)
    with GGUFFile(path) as gguf_file:
        if gguf_file.architecture != ARCH:
            raise ModelLoadError(path, f"architecture {gguf_file.architecture!r} is not {ARCH!r}")
        hparams = read_hparams(gguf_file)
        weights = load_weights(hparams, gguf_file, dtype, blocks=blocks, cache=WeightCache())
        tokenizer = from_gguf(gguf_file)
        target = MuseGlimmerTarget(hparams, weights, tokenizer=tokenizer, dtype=dtype, path=path, device=device)
        attach_at_load(target, gguf_file, options)
    return target
