"""The converter: a transformers checkpoint directory (``save_pretrained``, the NextN layer added
as the released checkpoints carry it) -> GGUF through ``tsspec convert``'s dispatch, loading to
the same logits as the in-memory conversion; and one-line errors for what it cannot map."""

from __future__ import annotations

import json

import pytest
import torch

from tsspec.errors import ModelLoadError


@pytest.fixture(scope="module")
def checkpoint_dir(oracle, tmp_path_factory):
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("hf")
    oracle.model.save_pretrained(folder)
    files = sorted(folder.glob("*.safetensors"))
    state = load_file(str(files[0]))
    L = oracle.config.num_hidden_layers
    for key, value in oracle.state_dict().items():
        if key.startswith(f"model.layers.{L}."):
            state[key] = value.contiguous()
    save_file(state, str(files[0]), metadata={"format": "pt"})
    return folder


def test_convert_dispatch_writes_a_loadable_file(checkpoint_dir, tmp_path, make_target, sequence):
    from tsspec.runtime.converting import convert_as
    from tsspec_gguf.gguf_file import GGUFFile
    from tsspec_model_glm_dsa.loader import load_from_source
    from tsspec_model_glm_dsa.request import NextNRequest

    out = tmp_path / "from-dir.gguf"
    convert_as("glm_moe_dsa", checkpoint_dir, out, outtype="f32")
    with GGUFFile(out) as gf:
        assert gf.architecture == "glm-dsa"
        assert gf.get("glm-dsa.nextn_predict_layers") == 1
        assert list(gf.get("glm-dsa.attention.indexer.types")) == [True, True, False, True]
        assert gf.tensor_names[-1].startswith("blk.4.")  # the NextN layer is the file's tail
        target = load_from_source(gf, request=NextNRequest(True, ""))
    assert target.draft_head is not None
    got, _ = target.spec_forward(sequence[:12], all_logits_rows=True, want_hidden=False)
    want, _ = make_target().spec_forward(sequence[:12], all_logits_rows=True, want_hidden=False)
    assert torch.equal(got, want)


def test_conversion_errors_are_one_line(oracle, tmp_path):
    from tsspec_model_glm_dsa.convert import ConversionError, convert_hf_dir, convert_state_dict

    with pytest.raises(ConversionError, match="no config.json"):
        convert_hf_dir(tmp_path, tmp_path / "x.gguf")
    cfg = oracle.config.to_dict()
    with pytest.raises(ConversionError, match="lacks kv_lora_rank"):
        convert_state_dict({k: v for k, v in cfg.items() if k != "kv_lora_rank"}, {})
    with pytest.raises(ConversionError, match="is not glm_moe_dsa"):
        convert_state_dict({**cfg, "model_type": "llama"}, {})
    with pytest.raises(ConversionError, match="rope_type"):
        convert_state_dict({**cfg, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, oracle.state_dict())
    with pytest.raises(ConversionError, match="no glm-dsa name"):
        convert_state_dict(cfg, {**oracle.state_dict(), "model.layers.0.mystery.weight": torch.zeros(2)})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="no \\*.safetensors"):
        convert_hf_dir(tmp_path, tmp_path / "x.gguf")


def test_bad_metadata_is_a_named_load_error(converted):
    from tsspec_gguf.gguf_file import MemorySource
    from tsspec_model_glm_dsa.loader import load_from_source
    from tsspec_model_glm_dsa.request import NextNRequest

    arch, meta, tensors = converted
    bad = {**meta, "glm-dsa.attention.indexer.types": [False, True, True, True]}
    with pytest.raises(ModelLoadError, match="shared indexer layer"):
        load_from_source(MemorySource(arch, bad, tensors), request=NextNRequest(False, "x"))
    short = {k: v for k, v in tensors.items() if k != "blk.1.attn_k_b.weight"}
    with pytest.raises(ModelLoadError, match="blk.1.attn_k_b.weight"):
        load_from_source(MemorySource(arch, meta, short), request=NextNRequest(False, "x"))


def test_indexer_pattern_without_the_types_key(converted):
    """A file without attention.indexer.types: all layers full below a 2^20 context (GLM 5 /
    5.1), GLM 5.2's pattern (0, 1, then every fourth from 2) from it on, as llama.cpp reads it."""
    from tsspec_gguf.gguf_file import MemorySource
    from tsspec_model_glm_dsa.hparams import GlmDsaHParams

    arch, meta, tensors = converted
    bare = {k: v for k, v in meta.items() if not k.endswith("indexer.types")}
    assert GlmDsaHParams.from_gguf(MemorySource(arch, bare, tensors)).indexer_full == (True,) * 4
    long = {**bare, "glm-dsa.block_count": 11, "glm-dsa.context_length": 1 << 20}
    assert GlmDsaHParams.from_gguf(MemorySource(arch, long, tensors)).indexer_full == (
        True, True, True, False, False, False, True, False, False, False)
