"""The plugin surface: the entry point, the model registration, loading through core, and clear
load errors for files that are not what they claim."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

import tsspec_model_qwen35
from tsspec.errors import ModelLoadError


def test_entry_point_and_registrations():
    eps = [ep for ep in entry_points(group="tsspec") if ep.name == "qwen35"]
    assert eps and eps[0].value == "tsspec_model_qwen35"
    seen = []
    tsspec_model_qwen35.tsspec_register_models(lambda archs, loader: seen.append((archs, loader)))
    assert seen[0][0] == ["qwen35", "qwen35moe", "qwen3next"]
    converters = []
    tsspec_model_qwen35.tsspec_register_converters(lambda types, fn, **kw: converters.append(types))
    assert converters == [["qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"]]


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_load_model_through_core(arch, gguf_path):
    from tsspec.runtime.loading import load_model

    target = load_model(gguf_path(arch), dtype="float64")
    assert target.config.architecture == arch
    assert target.config.extra["dtype"] == "float64"
    assert target.config.extra["v_head_order"] == ("grouped" if arch == "qwen3next" else "tiled")
    assert target.draft_head is not None
    if not torch.cuda.is_available():  # --device cuda is served where torch has CUDA
        with pytest.raises(ModelLoadError, match="no CUDA device"):
            load_model(gguf_path(arch), device="cuda")
    with pytest.raises(ModelLoadError, match="runs on cpu or cuda"):
        load_model(gguf_path(arch), device="meta")


def test_missing_or_misshapen_tensors_are_named(converted, tmp_path):
    from tsspec_gguf.gguf_writer import write_gguf
    from tsspec.runtime.loading import load_model

    arch, meta, tensors = converted("qwen35")
    broken = {k: v for k, v in tensors.items() if k != "blk.2.ssm_out.weight"}
    path = write_gguf(tmp_path / "missing.gguf", arch, meta, broken)
    with pytest.raises(ModelLoadError, match="blk.2.ssm_out.weight"):
        load_model(path)
    bent = dict(tensors)
    bent["blk.1.attn_k.weight"] = tensors["blk.1.attn_k.weight"][:-1]
    path = write_gguf(tmp_path / "bent.gguf", arch, meta, bent)
    with pytest.raises(ModelLoadError, match="blk.1.attn_k.weight"):
        load_model(path)
    odd = dict(meta)
    odd[f"{arch}.ssm.time_step_rank"] = 3  # 3 value heads over 2 key heads
    path = write_gguf(tmp_path / "odd.gguf", arch, odd, tensors)
    with pytest.raises(ModelLoadError, match="value heads"):
        load_model(path)


def test_the_plugin_declares_the_switch_it_reads():
    from tsspec.testing import plugin_catalog

    import tsspec_model_qwen35
    from tsspec_model_qwen35.target import SNAPSHOTS_ENV, snapshots_enabled

    assert set(tsspec_model_qwen35.SWITCHES) == {SNAPSHOTS_ENV}
    assert set(plugin_catalog({"qwen35": tsspec_model_qwen35}).switches) == {SNAPSHOTS_ENV}
    assert snapshots_enabled({SNAPSHOTS_ENV: "no"}) is False and snapshots_enabled({}) is True
