"""hf_checkpoint: reading an HF directory for a converter, and the matrices' output type."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tsspec_gguf.hf_checkpoint import ConversionError, quantised, read_checkpoint


def test_reads_config_and_shards_and_names_what_is_missing(tmp_path):
    from safetensors.torch import save_file

    with pytest.raises(ConversionError, match="config.json is unreadable"):
        read_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x"}))
    with pytest.raises(ConversionError, match="no \\*.safetensors files"):
        read_checkpoint(tmp_path)
    save_file({"a": torch.ones(2)}, str(tmp_path / "m-1.safetensors"))
    save_file({"b": torch.zeros(3)}, str(tmp_path / "m-2.safetensors"))
    config, state = read_checkpoint(tmp_path)
    assert config == {"model_type": "x"} and sorted(state) == ["a", "b"]


def test_only_float32_matrices_change_type():
    from gguf import GGMLQuantizationType

    tensors = {"w": np.ones((2, 64), np.float32), "odd": np.ones((2, 5), np.float32), "v": np.ones(4, np.float32),
               "ids": np.arange(6, dtype=np.int32).reshape(2, 3)}
    assert quantised(tensors, "f16")["w"].dtype == np.float16 and quantised(tensors, "f16")["v"].dtype == np.float32
    q = quantised(tensors, "q8_0")
    assert q["w"][1] == GGMLQuantizationType.Q8_0 and q["odd"].dtype == np.float32 and q["ids"].dtype == np.int32
    with pytest.raises(ConversionError, match="'q2' is not one of f32, f16, q8_0"):
        quantised(tensors, "q2")
