"""The HF -> GGUF converter: both checkpoint namings, the MTP block, the I32 hash table, the
output types, the registered converter hook, and clear refusals."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

import tsspec_model_deepseek_v4 as plugin
from tsspec.errors import ModelLoadError
from tsspec_model_deepseek_v4.convert import ConversionError, canonical_names, convert_hf_dir, convert_state_dict


def _deepseek_naming(hf_state: dict) -> dict:
    """The same weights under DeepSeek's release names (per-expert w1 / w2 / w3)."""
    out = {}
    for key, value in canonical_names(hf_state).items():
        m = re.match(r"^(.*)\.ffn\.experts\.(gate_up|down)$", key)
        if not m:
            out[key] = value
            continue
        for e in range(value.shape[0]):
            if m.group(2) == "gate_up":
                gate, up = value[e].chunk(2, dim=0)
                out[f"{m.group(1)}.ffn.experts.{e}.w1.weight"] = gate
                out[f"{m.group(1)}.ffn.experts.{e}.w3.weight"] = up
            else:
                out[f"{m.group(1)}.ffn.experts.{e}.w2.weight"] = value[e]
    return out


def test_both_namings_convert_to_the_same_file(oracle, converted):
    arch, meta, tensors = converted
    names = _deepseek_naming(oracle.state_dict())
    assert "layers.1.attn.indexer.compressor.wkv.weight" in names and "mtp.0.e_proj.weight" in names
    _, meta2, tensors2 = convert_state_dict(oracle.config, names)
    assert meta2 == meta and sorted(tensors2) == sorted(tensors)
    for name in tensors:
        np.testing.assert_array_equal(tensors2[name], tensors[name], err_msg=name)


def test_layout(oracle, converted):
    arch, meta, t = converted
    assert arch == "deepseek4"
    assert meta["deepseek4.block_count"] == 6 and meta["deepseek4.nextn_predict_layers"] == 1
    assert meta["deepseek4.attention.compress_ratios"] == [0, 2, 8, 2, 8, 0]
    assert meta["deepseek4.attention.indexer.types"] == [0, 1, 0, 1, 0, 0]
    assert meta["deepseek4.hash_layer_count"] == 2
    assert meta["deepseek4.rope.scaling.type"] == "yarn" and meta["deepseek4.rope.dimension_count"] == 8
    assert t["blk.0.ffn_gate_tid2eid.weight"].dtype == np.int32
    assert t["blk.1.attn_compressor_kv.weight"].shape == (32, 32)  # overlapping (CSA): 2 x head_dim
    assert t["blk.2.attn_compressor_kv.weight"].shape == (16, 32)  # HCA: head_dim
    assert "blk.2.indexer.proj.weight" not in t and "blk.1.indexer.proj.weight" in t
    assert t["blk.5.nextn.e_proj.weight"].shape == (32, 32) and "blk.5.attn_q_a.weight" in t
    sd = oracle.model.state_dict()
    gate_up = sd["model.layers.3.mlp.experts.gate_up_proj"].numpy()
    np.testing.assert_array_equal(t["blk.3.ffn_up_exps.weight"], gate_up[:, 16:])


@pytest.fixture(scope="module")
def hf_dir(oracle, tmp_path_factory):
    """transformers' save_pretrained, plus the MTP block in DeepSeek's naming in its own shard."""
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("hf")
    oracle.model.save_pretrained(path)
    mtp = {k: v.contiguous() for k, v in _deepseek_naming(oracle.state_dict()).items() if k.startswith("mtp.")}
    save_file(mtp, str(path / "mtp.safetensors"))
    return path


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_hf_dir_to_gguf_loads(hf_dir, tmp_path, make_target, converted, sequence, rel_err, outtype):
    """f32: the same logits as the in-memory conversion. q8_0: 2-D matrices are Q8_0 within
    quantisation error, tables and hyper-connection maps stay exact (the logits of a random
    tiny MoE jump with any routing flip, so they are not compared)."""
    from tsspec_gguf.gguf_file import GGUFFile
    from tsspec_model_deepseek_v4.loader import load_from_source

    out = tmp_path / f"model-{outtype}.gguf"
    convert_hf_dir(hf_dir, out, outtype=outtype)
    _, _, tensors = converted
    with GGUFFile(out) as gf:
        assert gf.tensor_info("blk.0.ffn_gate_tid2eid.weight").ggml_type == 26  # GGML I32
        np.testing.assert_array_equal(gf.tensor("blk.0.ffn_gate_tid2eid.weight").numpy(),
                                      tensors["blk.0.ffn_gate_tid2eid.weight"])
        np.testing.assert_array_equal(gf.tensor("blk.1.hc_attn_fn.weight").numpy(), tensors["blk.1.hc_attn_fn.weight"])
        if outtype == "q8_0":
            assert gf.tensor_info("blk.1.attn_q_a.weight").ggml_type == 8
            assert gf.tensor_info("blk.1.attn_q_b.weight").ggml_type == 1  # 24 columns: no Q8_0 blocks, F16
            w = gf.tensor("blk.1.attn_q_a.weight")
            assert rel_err(w, torch.from_numpy(tensors["blk.1.attn_q_a.weight"])) < 1e-2
        target = load_from_source(gf)
    assert target.draft_head is not None
    logits, _ = target.spec_forward(sequence[:12], all_logits_rows=True, want_hidden=False)
    assert torch.isfinite(logits).all()
    if outtype == "f32":
        ref, _ = make_target().spec_forward(sequence[:12], all_logits_rows=True, want_hidden=False)
        assert rel_err(logits, ref) < 1e-6


def test_registered_converter_hook(hf_dir, tmp_path):
    registered = []
    plugin.tsspec_register_converters(lambda types, fn, **kw: registered.append((types, fn, kw)))
    (types, fn, kw), = registered
    assert types == ["deepseek_v4"] and kw["description"]
    fn(hf_dir, tmp_path / "x.gguf", outtype="f16")
    assert (tmp_path / "x.gguf").stat().st_size > 0


def test_refusals(oracle, tmp_path):
    sd = dict(oracle.state_dict(with_mtp=False))
    sd["model.layers.0.self_attn.kv_proj.scale"] = torch.ones(1)
    with pytest.raises(ConversionError, match="FP8"):
        convert_state_dict(oracle.config, sd)
    with pytest.raises(ConversionError, match="no config.json"):
        convert_hf_dir(tmp_path, tmp_path / "x.gguf")
    cfg = oracle.config.to_dict()
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(ConversionError, match="deepseek_v4"):
        convert_state_dict({**cfg, "model_type": "llama"}, {})


def test_missing_tensor_is_a_clear_load_error(converted):
    from tsspec_model_deepseek_v4.loader import load_from_source
    from tsspec_model_deepseek_v4.source import MemorySource

    arch, meta, tensors = converted
    tensors = {k: v for k, v in tensors.items() if k != "blk.1.indexer.proj.weight"}
    with pytest.raises(ModelLoadError, match="blk.1.indexer.proj.weight"):
        load_from_source(MemorySource(arch, meta, tensors))


def test_tsspec_convert_command(hf_dir, tmp_path):
    """``tsspec convert SRC OUT`` dispatches on config.json's model_type to this plugin."""
    from tsspec.cli.app import main
    from tsspec_gguf.gguf_file import GGUFFile

    out = tmp_path / "cli.gguf"
    try:
        main(["convert", str(hf_dir), str(out), "--outtype", "f16"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    with GGUFFile(out) as gf:
        assert gf.architecture == "deepseek4" and gf.get("deepseek4.nextn_predict_layers") == 1
