"""HF DFlash checkpoints (z-lab and muse_glimmer_assistant layouts) -> GGUF dflash."""

from __future__ import annotations

import json

import pytest
import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf.gguf_file import GGUFFile

from tsspec_block.config import config_from_gguf
from tsspec_block.converter import convert_checkpoint, gguf_from_state_dict

H, F, HD, NH, NKV = 16, 24, 4, 4, 2


def _layer_state(prefix=""):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    state = {}
    for i in range(2):
        p = f"{prefix}layers.{i}."
        state.update({
            p + "input_layernorm.weight": r(H), p + "post_attention_layernorm.weight": r(H),
            p + "self_attn.q_proj.weight": r(NH * HD, H), p + "self_attn.k_proj.weight": r(NKV * HD, H),
            p + "self_attn.v_proj.weight": r(NKV * HD, H), p + "self_attn.o_proj.weight": r(H, NH * HD),
            p + "self_attn.q_norm.weight": r(HD), p + "self_attn.k_norm.weight": r(HD),
            p + "mlp.gate_proj.weight": r(F, H), p + "mlp.up_proj.weight": r(F, H), p + "mlp.down_proj.weight": r(H, F),
        })
    state[prefix + "norm.weight"] = r(H)
    return state


def _config(**over):
    cfg = {"hidden_size": H, "intermediate_size": F, "num_hidden_layers": 2, "num_attention_heads": NH,
           "num_key_value_heads": NKV, "head_dim": HD, "rms_norm_eps": 1e-5,
           "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
           "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 32}
    cfg.update(over)
    return cfg


def _assistant(prefix=""):
    state = _layer_state(prefix)
    state[prefix + "encoder.fc.weight"] = torch.randn(H, 3 * H)
    state[prefix + "encoder.output_norm_enc.weight"] = torch.randn(H)
    config = _config(target_layer_ids=[1, 13, 25], block_size=16, mask_token_id=7)
    return state, config


def _read(path):
    with GGUFFile(path) as gf:
        return gf, config_from_gguf(gf), set(gf.tensor_names), {k: gf.get(k) for k in gf.keys}


@pytest.mark.parametrize("prefix", ["", "model."])
def test_assistant_layout(tmp_path, prefix):
    state, config = _assistant(prefix)
    out = tmp_path / "a.gguf"
    assert gguf_from_state_dict(state, config, out) == "muse_glimmer_assistant"
    _, cfg, names, meta = _read(out)
    assert meta["general.architecture"] == "dflash"
    assert cfg.target_layers == (2, 14, 26)  # trap 3: HF layer OUTPUTS + 1
    assert cfg.target_hidden_size == H and cfg.block_size == 16 and cfg.mask_token_id == 7
    assert meta["tokenizer.ggml.mask_token_id"] == 7
    assert cfg.sliding_window == 32 and cfg.sliding_layers == (True, False)
    assert cfg.rope_base == 500000.0 and cfg.head_dim == HD and cfg.n_head_kv == NKV
    assert {"fc.weight", "enc.output_norm.weight", "output_norm.weight", "blk.1.attn_q_norm.weight",
            "blk.0.ffn_norm.weight", "blk.1.attn_output.weight"} <= names
    with GGUFFile(out) as gf:
        assert torch.equal(gf.tensor("blk.0.ffn_norm.weight"), state[prefix + "layers.0.post_attention_layernorm.weight"])
        assert gf.tensor_shape("fc.weight") == (H, 3 * H)


def test_zlab_dflash2_layout(tmp_path):
    state = _layer_state()
    state.update({"fc.weight": torch.randn(H, 2 * H), "hidden_norm.weight": torch.randn(H)})
    for i in range(2):
        for side in ("attention_conv", "mlp_conv"):
            state[f"layers.{i}.{side}.base_kernel"] = torch.randn(2, 2, H)
            state[f"layers.{i}.{side}.kernel_projection.weight"] = torch.randn(2 * 2 * 4, H)
    state["candidate_selector.hidden_projection.weight"] = torch.randn(3, H)
    state["candidate_selector.predecessor_codebook"] = torch.randn(50, 3)
    state["candidate_selector.successor_codebook"] = torch.randn(50, 3)
    config = _config(is_causal=False, vocab_size=50, layer_types=["sliding_attention"] * 2, dflash_config={
        "target_layer_ids": [1, 3], "mask_token_id": 49, "block_size": 8, "conv_kernel_size": 2,
        "conv_group_size": 4, "selector_rank": 3, "selector_top_k": 5,
        "output_multiplier": 0.19611613513818404, "final_logit_softcapping": 20.0})
    out = tmp_path / "z.gguf"
    assert gguf_from_state_dict(state, config, out, out_type="f16") == "z-lab"
    gf, cfg, names, _ = _read(out)
    assert cfg.target_layers == (2, 4) and cfg.block_size == 8 and cfg.vocab_size == 50
    assert cfg.has_conv and cfg.conv_kernel_size == 2 and cfg.conv_group_size == 4
    assert cfg.has_selector and cfg.selector_rank == 3 and cfg.selector_top_k == 5
    assert cfg.logit_scale == pytest.approx(0.19611613513818404) and cfg.logit_softcap == 20.0
    assert {"blk.0.attn_conv_base.weight", "blk.1.ffn_conv_proj.weight", "selector_hidden.weight",
            "selector_predecessor.weight", "selector_successor.weight", "enc.output_norm.weight"} <= names


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s, c: c.update(is_causal=True), "causally"),
        (lambda s, c: s.update({"layers.0.mystery.weight": torch.zeros(1)}), "unexpected tensor"),
        (lambda s, c: s.pop("fc.weight"), "not a DFlash checkpoint"),
        (lambda s, c: c["dflash_config"].pop("mask_token_id"), "mask_token_id"),
        (lambda s, c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1.0}), "rope_type"),
    ],
)
def test_unconvertible_checkpoints_fail_clearly(tmp_path, change, message):
    state = _layer_state()
    state.update({"fc.weight": torch.randn(H, 2 * H), "hidden_norm.weight": torch.randn(H)})
    config = _config(is_causal=False, dflash_config={"target_layer_ids": [0, 1], "mask_token_id": 3})
    change(state, config)
    with pytest.raises(ModelLoadError, match=message):
        gguf_from_state_dict(state, config, tmp_path / "x.gguf")


def test_checkpoint_directory_and_cli(tmp_path):
    from safetensors.torch import save_file
    from typer.testing import CliRunner

    import typer

    from tsspec_block.cli import register

    state, config = _assistant()
    src = tmp_path / "ckpt"
    src.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps(config))
    assert convert_checkpoint(src, tmp_path / "direct.gguf") == "muse_glimmer_assistant"

    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:  # a second command keeps typer from collapsing the app into one command
        pass

    out = tmp_path / "cli.gguf"
    result = CliRunner().invoke(app, ["convert-dflash", str(src), str(out)])
    assert result.exit_code == 0, result.output
    assert "muse_glimmer_assistant" in result.output
    assert _read(out)[1].target_layers == (2, 14, 26)
    with pytest.raises(ModelLoadError, match="no config.json"):
        convert_checkpoint(tmp_path, tmp_path / "none.gguf")


def test_tsspec_convert_dispatches_dflash_checkpoints(tmp_path):
    """``tsspec convert`` finds this plugin's converter by architectures (z-lab's drafter config
    says model_type qwen3); q8_0 is declined in one line."""
    from safetensors.torch import save_file

    import tsspec_block
    from tsspec.plugins import PluginHost
    from tsspec.runtime.catalog import build_catalog
    from tsspec.runtime.converting import convert_checkpoint

    host = PluginHost()
    host.register(tsspec_block, "block")
    catalog = build_catalog(host, discover=False)
    state, config = _assistant()
    for name, extra in (("a", {"model_type": "qwen3", "architectures": ["DFlash2DraftModel"]}),
                        ("z", {"model_type": "qwen3", "architectures": ["DFlashDraftModel"]})):
        src = tmp_path / name
        src.mkdir()
        save_file({k: v.contiguous() for k, v in state.items()}, str(src / "model.safetensors"))
        (src / "config.json").write_text(json.dumps({**config, **extra}))
        convert_checkpoint(catalog, src, tmp_path / f"{name}.gguf")
        assert _read(tmp_path / f"{name}.gguf")[1].target_layers == (2, 14, 26)
    with pytest.raises(ModelLoadError, match="f32 or f16"):
        convert_checkpoint(catalog, tmp_path / "a", tmp_path / "q.gguf", outtype="q8_0")
