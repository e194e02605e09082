"""The HF -> GGUF converter: llama.cpp's names and the conventions behind the three traps, the
checkpoint layouts it accepts, and ``tsspec convert`` (and its alias ``convert hf-to-gguf``) end
to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tsspec_model_qwen35.convert import ConversionError, convert_state_dict, tiled_head_order


def test_tiled_head_order():
    assert tiled_head_order(2, 4) == [0, 2, 1, 3]
    assert tiled_head_order(2, 6) == [0, 3, 1, 4, 2, 5]
    assert tiled_head_order(3, 3) == [0, 1, 2]
    # tiled head j must read key head j % num_k; HF's grouped head h reads key head h // r
    nk, nv = 4, 12
    r = nv // nk
    assert all(h // r == j % nk for j, h in enumerate(tiled_head_order(nk, nv)))


def test_norms_fold_plus_one_except_the_gdn_output_norm(oracle, converted):
    o = oracle("qwen35")
    _, _, t = converted("qwen35")
    sd = o.model.state_dict()
    np.testing.assert_allclose(t["blk.0.attn_norm.weight"], sd["model.layers.0.input_layernorm.weight"].numpy() + 1)
    np.testing.assert_allclose(t["blk.1.attn_q_norm.weight"], sd["model.layers.1.self_attn.q_norm.weight"].numpy() + 1)
    np.testing.assert_allclose(t["output_norm.weight"], sd["model.norm.weight"].numpy() + 1)
    np.testing.assert_allclose(t["blk.0.ssm_norm.weight"], sd["model.layers.0.linear_attn.norm.weight"].numpy())
    mtp = o.mtp.state_dict()
    np.testing.assert_allclose(t["blk.4.nextn.enorm.weight"], mtp["enorm.weight"].numpy() + 1)
    np.testing.assert_allclose(t["blk.4.nextn.shared_head_norm.weight"], mtp["post_norm.weight"].numpy() + 1)


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_gdn_tensors(arch, oracle, converted):
    o = oracle(arch)
    _, meta, t = converted(arch)
    a_log = o.model.state_dict()["model.layers.0.linear_attn.A_log"]
    order = tiled_head_order(2, 4) if arch == "qwen35" else [0, 1, 2, 3]
    np.testing.assert_allclose(t["blk.0.ssm_a"], -torch.exp(a_log)[order].numpy(), rtol=1e-6)
    assert t["blk.0.ssm_conv1d.weight"].shape == (2 * 16 + 32, 4)
    assert t["blk.0.attn_qkv.weight"].shape == (64, 32) and t["blk.0.attn_gate.weight"].shape == (32, 32)
    assert ("blk.0.ssm_ba.weight" in t) == (arch == "qwen3next")
    assert ("blk.0.ssm_beta.weight" in t) == (arch == "qwen35")
    assert meta[f"{arch}.block_count"] == 5 and meta[f"{arch}.nextn_predict_layers"] == 1
    assert meta[f"{arch}.full_attention_interval"] == 2
    assert meta[f"{arch}.rope.dimension_count"] == 4  # 16 * partial_rotary_factor 0.25
    assert meta[f"{arch}.ssm.group_count"] == 2 and meta[f"{arch}.ssm.time_step_rank"] == 4


def test_tied_embeddings_have_no_output_tensor(converted):
    _, _, t = converted("qwen35moe")
    assert "output.weight" not in t
    assert t["blk.0.ffn_gate_exps.weight"].shape == (4, 24, 32)
    assert t["blk.0.ffn_gate_inp_shexp.weight"].shape == (32,)


def test_checkpoint_layouts_give_the_same_file(oracle, converted):
    """Per-expert modules and the multimodal ``model.language_model.`` prefix convert to the
    same tensors as transformers' fused in-memory layout."""
    o = oracle("qwen35moe")
    sd = {}
    for key, value in o.state_dict().items():
        if key.endswith("experts.gate_up_proj"):
            base = key[: -len("gate_up_proj")]
            gate, up = value.chunk(2, dim=1)
            for e in range(value.shape[0]):
                sd[f"{base}{e}.gate_proj.weight"], sd[f"{base}{e}.up_proj.weight"] = gate[e], up[e]
        elif key.endswith("experts.down_proj"):
            base = key[: -len("down_proj")]
            for e in range(value.shape[0]):
                sd[f"{base}{e}.down_proj.weight"] = value[e]
        elif key.startswith("model."):
            sd["model.language_model." + key[len("model."):]] = value
        else:
            sd[key] = value
    sd["model.visual.patch_embed.weight"] = torch.zeros(2)  # vision tower: ignored
    _, meta, tensors = convert_state_dict({"text_config": o.config.to_dict()}, sd)
    _, meta_ref, ref = converted("qwen35moe")
    assert set(tensors) == set(ref) and meta == meta_ref
    for name in ref:
        np.testing.assert_array_equal(tensors[name], ref[name])


def test_errors(oracle):
    o = oracle("qwen35")
    with pytest.raises(ConversionError, match="model_type"):
        convert_state_dict({"model_type": "llama"}, {})
    sd = o.state_dict()
    sd["model.layers.0.extra.weight"] = torch.zeros(1)
    with pytest.raises(ConversionError, match="not mapped"):
        convert_state_dict(o.config, sd)
    sd = o.state_dict()
    del sd["model.layers.0.linear_attn.A_log"]
    with pytest.raises(ConversionError, match="A_log"):
        convert_state_dict(o.config, sd)


def test_irregular_layer_types_are_written_per_layer(oracle, rel_err, sequence):
    """A layer pattern no interval reproduces goes into a per-layer array the loader reads."""
    import transformers as t

    from tsspec_model_qwen35.loader import load_from_source
    from tsspec_model_qwen35.source import MemorySource

    base = oracle("qwen35").config.to_dict()
    base.pop("full_attention_interval", None)
    base["layer_types"] = ["linear_attention", "full_attention", "full_attention", "linear_attention"]
    config = t.Qwen3_5TextConfig(**{k: v for k, v in base.items() if k in t.Qwen3_5TextConfig().to_dict()})
    config._attn_implementation = "eager"
    torch.manual_seed(5)
    model = t.Qwen3_5ForCausalLM(config).eval()
    arch, meta, tensors = convert_state_dict(config, model.state_dict())
    assert meta["qwen35.attention.recurrent_layers"] == [True, False, False, True]
    target = load_from_source(MemorySource(arch, meta, tensors))
    assert target.hp.recurrent == (True, False, False, True)
    logits, _ = target.spec_forward(sequence[:20], all_logits_rows=True, want_hidden=False)
    with torch.no_grad():
        ref = model(torch.tensor([sequence[:20]]), use_cache=False).logits[0]
    assert rel_err(logits, ref) < 1e-4


def test_cli_converts_a_checkpoint_directory(oracle, tmp_path, rel_err, sequence, monkeypatch):
    """``tsspec convert DIR OUT`` (and ``convert hf-to-gguf DIR OUT``): safetensors (with mtp.*
    weights) + config.json in, a GGUF the model registry loads out, with HF's logits."""
    from safetensors.torch import save_file
    from typer.testing import CliRunner

    import tsspec_model_qwen35
    from tsspec.cli.app import build_app
    from tsspec.cli.state import STATE
    from tsspec.plugins import PluginHost
    from tsspec.runtime.catalog import build_catalog
    from tsspec.runtime.loading import load_model

    o = oracle("qwen3next")
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(o.config.to_dict()))
    save_file({k: v.contiguous() for k, v in o.state_dict().items()}, str(src / "model.safetensors"))
    out = tmp_path / "out.gguf"
    host = PluginHost()
    host.register(tsspec_model_qwen35, "qwen35")
    monkeypatch.setattr(STATE, "catalog", build_catalog(host, discover=False))
    app = build_app()
    result = CliRunner().invoke(app, ["convert", "hf-to-gguf", str(src), str(out)])
    assert result.exit_code == 0, result.output
    assert "qwen3_next" in result.output
    q8 = CliRunner().invoke(app, ["convert", str(src), str(tmp_path / "q8.gguf"), "--outtype", "q8_0"])
    assert q8.exit_code == 0, q8.output
    target = load_model(out)
    assert type(target).__name__ == "Qwen35Target" and target.draft_head is not None
    logits, _ = target.spec_forward(sequence[:12], all_logits_rows=True, want_hidden=False)
    assert rel_err(logits, o.logits(sequence[:12])) < 1e-4
    bad = CliRunner().invoke(app, ["convert", "hf-to-gguf", str(tmp_path / "missing"), str(out)])
    assert bad.exit_code != 0
