"""cpu_dtype: the dtypes a CPU-only model plugin runs, and its one-line load errors."""

from __future__ import annotations

import types

import pytest
import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf.cpu_dtype import cpu_load_dtype, resolve_dtype


def test_names_and_defaults():
    assert resolve_dtype(None) is torch.float32 and resolve_dtype("auto") is torch.float32
    assert resolve_dtype("fp64") is torch.float64 and resolve_dtype(torch.float64) is torch.float64
    with pytest.raises(ValueError, match="'int4' is not supported by tsspec-x"):
        resolve_dtype("int4", "tsspec-x")


def test_load_errors_name_the_plugin_and_the_file():
    with pytest.raises(ModelLoadError, match="m.gguf.*tsspec-x runs on the CPU only"):
        cpu_load_dtype("m.gguf", types.SimpleNamespace(device="cuda", dtype=None), "tsspec-x")
    with pytest.raises(ModelLoadError, match="'bf16' is not supported by tsspec-x"):
        cpu_load_dtype("m.gguf", types.SimpleNamespace(device="cpu", dtype="bf16"), "tsspec-x")
    assert cpu_load_dtype("m.gguf", None, "tsspec-x") is torch.float32
