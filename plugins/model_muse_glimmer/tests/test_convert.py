"""HF checkpoints -> GGUF through the plugin's converters (the ``tsspec convert`` hook): the trunk
(vision tower skipped), its outtypes and refusals, and the assistant -> ``dflash``."""

from __future__ import annotations

import logging

import pytest
import torch

from .test_target import IDS, forward, rel_err


def _registered():
    """model_type -> (converter, description), through a fresh plugin host and pluggy."""
    import tsspec_model_muse_glimmer as plugin
    from tsspec.plugins import PluginHost

    table = {}

    def register(model_types, converter, *, description=""):
        for model_type in model_types:
            table[model_type] = (converter, description)

    host = PluginHost()
    assert host.register(plugin, "muse-glimmer").hooks == ["tsspec_register_converters", "tsspec_register_models"]
    host.call_each("tsspec_register_converters", lambda name: {"register": register})
    return table


def test_hook_registers_both_model_types():
    table = _registered()
    assert {"muse_glimmer", "MuseGlimmerForConditionalGeneration", "MuseGlimmerAssistantModel"} <= set(table)
    assert all(desc for _, desc in table.values())


@pytest.mark.parametrize("outtype,tol", [("f32", 1e-4), ("f16", 2e-2), ("q8_0", 0.1)])  # 8-bit blocks of 32: ~6% at this width
def test_trunk_directory_converts_and_matches_transformers(tmp_path, helpers, caplog, outtype, tol):
    from tsspec_model_muse_glimmer import load_muse_glimmer

    model = helpers.make_hf_muse(1)
    model.save_pretrained(tmp_path / "hf")
    converter, _ = _registered()["muse_glimmer"]
    out = tmp_path / f"muse-{outtype}.gguf"
    with caplog.at_level(logging.WARNING, logger="tsspec.muse_glimmer"):
        converter(tmp_path / "hf", out, outtype=outtype)
    assert any("vision tower" in r.getMessage() for r in caplog.records)
    target = load_muse_glimmer(out)
    assert rel_err(forward(target, IDS), helpers.hf_logits(model, IDS)) < tol


def test_gguf_names_and_conventions(helpers):
    from tsspec_model_muse_glimmer.convert import muse_glimmer_gguf

    model = helpers.make_hf_muse(0, qk_scale_factor=2.5)
    meta, tensors = muse_glimmer_gguf(model.config.to_dict(), model.state_dict())
    sd = model.state_dict()
    hf = "model.language_model."
    assert meta["muse-glimmer.attention.sliding_window_pattern"] == [True, True, True, False]
    assert torch.equal(torch.from_numpy(tensors["blk.0.attn_norm.weight"]), sd[hf + "layers.0.input_layernorm.weight"] + 1)
    assert torch.equal(torch.from_numpy(tensors["output_norm.weight"]), sd[hf + "norm.weight"])  # final norm: no +1
    assert (tensors["blk.2.attn_q_norm.weight"] == 2.5).all() and (tensors["blk.2.attn_k_norm.weight"] == 1).all()
    assert torch.equal(torch.from_numpy(tensors["blk.1.attn_gate.weight"]), sd[hf + "layers.1.self_attn.gate_proj.weight"])
    assert not any("vision" in name for name in tensors)


def test_rope_on_a_global_layer_is_refused(helpers):
    from tsspec_model_muse_glimmer.convert import ConversionError, muse_glimmer_gguf

    model = helpers.make_hf_muse(0, layer_rope_theta=[10000.0] * 4)
    with pytest.raises(ConversionError, match="exactly the sliding layers"):
        muse_glimmer_gguf(model.config.to_dict(), model.state_dict())


def test_assistant_converts_to_dflash_with_the_logit_transform(tmp_path):
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    from tsspec_gguf.gguf_file import GGUFFile

    cfg = MuseGlimmerAssistantConfig(hidden_size=64, intermediate_size=80, num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, block_size=4, mask_token_id=95,
                                     target_layer_ids=[0, 2], sliding_window=8, max_position_embeddings=256,
                                     bos_token_id=None, eos_token_id=None, pad_token_id=None)
    MuseGlimmerAssistantModel(cfg).save_pretrained(tmp_path / "hf")
    converter, _ = _registered()["muse_glimmer_assistant"]
    converter(tmp_path / "hf", tmp_path / "dflash.gguf", outtype="f32")
    with GGUFFile(tmp_path / "dflash.gguf") as gf:
        assert gf.architecture == "dflash"
        assert gf.get("dflash.logit_scale") == pytest.approx(0.19611613513818404)
        assert gf.get("dflash.final_logit_softcapping") == pytest.approx(20.0)
        assert list(gf.get("dflash.target_layers")) == [1, 3]  # trap 3: HF ids name layer outputs
    with pytest.raises(Exception, match="q8_0"):
        converter(tmp_path / "hf", tmp_path / "q.gguf", outtype="q8_0")


def test_tsspec_convert_dispatches_to_these_converters(tmp_path, helpers, capsys):
    """The one ``tsspec convert`` command: the trunk, and the assistant with the logit transform
    (this plugin's converter, chosen by the checkpoint's ``architectures``)."""
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    from tsspec.cli.app import main
    from tsspec_gguf.gguf_file import GGUFFile

    def convert(*args):
        try:
            main(["convert", *map(str, args)])
        except SystemExit as exc:
            assert not exc.code, capsys.readouterr().err

    helpers.make_hf_muse(0).save_pretrained(tmp_path / "trunk")
    convert(tmp_path / "trunk", tmp_path / "trunk.gguf", "--outtype", "f16")
    with GGUFFile(tmp_path / "trunk.gguf") as gf:
        assert gf.architecture == "muse-glimmer"
    cfg = MuseGlimmerAssistantConfig(hidden_size=64, intermediate_size=80, num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, block_size=4, mask_token_id=95,
                                     target_layer_ids=[0, 2], max_position_embeddings=256,
                                     bos_token_id=None, eos_token_id=None, pad_token_id=None)
    MuseGlimmerAssistantModel(cfg).save_pretrained(tmp_path / "assistant")
    convert(tmp_path / "assistant", tmp_path / "dflash.gguf")
    with GGUFFile(tmp_path / "dflash.gguf") as gf:
        assert gf.architecture == "dflash" and gf.get("dflash.final_logit_softcapping") == pytest.approx(20.0)
