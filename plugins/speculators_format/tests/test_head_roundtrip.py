"""A tsspec-trained draft head exported as speculators' mtp and read back drafts exactly as
before on 20 prompts; the exported layer computes what Hugging Face's Qwen3 decoder layer
computes (transformers, not our code); the converted head stays lossless; heads and
checkpoints the format cannot carry fail in one line naming the piece."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tsspec.runtime.loading import load_model
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import assert_lossless

from tsspec_draft_head import make_draft_head
from tsspec_draft_head.nextn_file import read_nextn, write_nextn
from tsspec_draft_head.nextn_model import NextNConfig, NextNModule
from tsspec_speculators_format.exporter import ExportError, export_head
from tsspec_speculators_format.head_layouts import MTP, from_hf, to_hf
from tsspec_speculators_format.reader import SpeculatorsFormatError, convert_speculators

sys.path.insert(0, str(Path(__file__).parent))
from tiny_head import FFN, HEAD_DIM, HEADS, HIDDEN, KV_HEADS, LAYERS, VOCAB, chain, prompts, train_tiny_head  # noqa: E402

OPTIONS = SpeculationOptions(spec_type="draft-head", pmin=0.0, draft=3, adaptive=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target file, head file): a tiny qwen3 and a head its trainer wrote (``tiny_head``)."""
    return train_tiny_head(tmp_path_factory.mktemp("head"))


def test_the_trainer_writes_an_mtp_shaped_head(trained):
    _, head = trained
    module, facts, _ = read_nextn(head)
    assert module.cfg.qk_norm and module.cfg.shared_head  # copied from a Qwen3 layer, whole vocabulary
    assert module.head.shape[0] == 0 and facts["architecture"] == "qwen3"


def test_round_trip_drafts_identical_on_20_prompts(trained, tmp_path):
    model, head = trained
    config = export_head(head, tmp_path / "spec", verifier="tiny/qwen3", verifier_layers=LAYERS)
    assert config["speculators_model_type"] == "mtp" and config["architectures"] == ["MTPDraftModel"]
    assert config["speculators_config"]["verifier"] == {"name_or_path": "tiny/qwen3",
                                                        "architectures": ["Qwen3ForCausalLM"]}
    back = tmp_path / "back.gguf"
    assert convert_speculators(tmp_path / "spec", back) == "mtp"
    original = load_model(model, draft_model=head)
    converted = load_model(model, draft_model=str(back))
    drafts = [chain(original, p) for p in prompts()]
    assert [chain(converted, p) for p in prompts()] == drafts
    assert len({tuple(d) for d in drafts}) > 5  # the chains depend on the prompt
    a, _, _ = read_nextn(head)
    b, _, _ = read_nextn(str(back))
    for name, _ in a.named_parameters():
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_export_schema_and_names(trained, tmp_path):
    _, head = trained
    config = export_head(head, tmp_path / "spec", verifier_layers=LAYERS)
    assert json.loads((tmp_path / "spec" / "config.json").read_text()) == config
    layer = config["transformer_layer_config"]
    assert layer["model_type"] == "qwen3" and layer["num_hidden_layers"] == LAYERS and layer["vocab_size"] == VOCAB
    assert (layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"]) == (HEADS, KV_HEADS, HEAD_DIM)
    state = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert set(state) == {MTP.prefix + name for name in MTP.tensors.values()}  # no verifier-owned tensor
    assert state["mtp_layers.0.input_proj.weight"].shape == (HIDDEN, 2 * HIDDEN)


def test_rope_reordering_is_a_per_head_permutation():
    rows = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)  # 2 heads of 8, 3 columns
    hf = to_hf(rows, 8)
    assert hf[:4, 0].tolist() == rows[[0, 2, 4, 6], 0].tolist() and hf[8 + 4, 0] == rows[8 + 1, 0]
    assert np.array_equal(from_hf(hf, 8), rows)


def test_exported_layer_equals_transformers_qwen3_layer(trained, tmp_path):
    """The export's tensors in Hugging Face's own Qwen3DecoderLayer (half-layout RoPE) give the
    tsspec head's outputs (adjacent-pair RoPE) on one causal sequence."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3 import modeling_qwen3 as q3

    _, head = trained
    config = export_head(head, tmp_path / "spec", verifier_layers=LAYERS)
    state = {k.removeprefix(MTP.prefix): v for k, v in load_file(str(tmp_path / "spec" / "model.safetensors")).items()}
    hf_config = transformers.Qwen3Config(**config["transformer_layer_config"])
    hf_config._attn_implementation = "eager"
    layer = q3.Qwen3DecoderLayer(hf_config, layer_idx=0).eval()
    layer.load_state_dict({k: v for k, v in state.items() if k.startswith(("self_attn.", "mlp.", "input_layernorm",
                                                                          "post_attention_layernorm"))})
    rotary = q3.Qwen3RotaryEmbedding(hf_config)
    norm = lambda x, w: torch.nn.functional.rms_norm(x, (HIDDEN,), w, hf_config.rms_norm_eps)  # noqa: E731

    module, _, _ = read_nextn(head)
    g = torch.Generator().manual_seed(1)
    n = 7
    emb, hidden = torch.randn(1, n, HIDDEN, generator=g), torch.randn(1, n, HIDDEN, generator=g)
    positions = torch.arange(3, 3 + n)[None]  # [1, n]
    with torch.no_grad():
        proj = torch.cat([norm(emb, state["token_layernorm.weight"]), norm(hidden, state["hidden_layernorm.weight"])], -1)
        proj = proj @ state["input_proj.weight"].T  # [1, n, H]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]  # causal, additive
        out = layer(proj, attention_mask=mask, position_ids=positions, position_embeddings=rotary(proj, positions))
        out = norm(out[0] if isinstance(out, tuple) else out, state["final_layernorm.weight"])
        u = module.inputs(emb[0], hidden[0])
        qq, kk, vv = module.qkv(u, positions[0])
        ours = module.finish(u, module.attend(qq[None], kk[None], vv[None], torch.ones(n, n).tril().bool())[0])
    assert torch.allclose(out[0], ours, atol=1e-5), (out[0] - ours).abs().max()


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=3)],
                         ids=["greedy", "sampled"])
def test_converted_head_is_lossless(trained, tmp_path, sampling):
    model, head = trained
    export_head(head, tmp_path / "spec", verifier_layers=LAYERS)
    convert_speculators(tmp_path / "spec", tmp_path / "back.gguf")
    _, spec = assert_lossless(lambda: load_model(model, draft_model=str(tmp_path / "back.gguf")),
                              lambda t: make_draft_head(t, OPTIONS), [7, 3, 11, 40, 2], max_tokens=24,
                              sampling=sampling, options=OPTIONS)
    assert spec.stats.draft_tokens > 0


def _head(tmp_path, **cfg) -> str:
    config = NextNConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_heads=HEADS, num_kv_heads=KV_HEADS,
                         head_dim=HEAD_DIM, draft_vocab=16, **cfg)
    module = NextNModule(config, VOCAB)
    path = tmp_path / "h.gguf"
    write_nextn(path, module, target={"architecture": "llama", "vocab_size": VOCAB}, outtype="f32")
    return str(path)


def test_a_head_the_format_cannot_carry_names_the_missing_pieces(tmp_path):
    with pytest.raises(ExportError, match="q/k norms.*LM head.*eagle3 needs attention") as info:
        export_head(_head(tmp_path), tmp_path / "spec", verifier_layers=2)  # the shipped head's shape
    assert "\n" not in str(info.value)
    with pytest.raises(ExportError, match="verifier's own LM head"):
        export_head(_head(tmp_path, qk_norm=True), tmp_path / "spec", verifier_layers=2)
    with pytest.raises(ExportError, match="takes no tsspec draft head"):
        export_head(_head(tmp_path), tmp_path / "spec", kind="dflash", verifier_layers=2)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["transformer_layer_config"].update(model_type="qwen3_next"), "model_type 'qwen3_next'"),
    (lambda c: c.update(num_nextn_predict_layers=2), "more than one MTP layer"),
    (lambda c: c["transformer_layer_config"].update(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "yarn"),
    (lambda c: c["speculators_config"]["verifier"].update(architectures=["FooForCausalLM"]), "FooForCausalLM"),
])
def test_mtp_checkpoints_tsspec_cannot_run_fail_in_one_line(trained, tmp_path, edit, message):
    _, head = trained
    config = export_head(head, tmp_path / "spec", verifier_layers=LAYERS)
    edit(config)
    (tmp_path / "spec" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpeculatorsFormatError, match=message) as info:
        convert_speculators(tmp_path / "spec", tmp_path / "b.gguf")
    assert "\n" not in str(info.value)
