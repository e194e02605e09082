"""The Muse-Glimmer DFlash assistant on the real trunk: drafts == transformers'
DFlashTokenCandidateGenerator (float64), the three ways it attaches (--draft-model, the
environment, carried in the target's file), and lossless ``block`` generation end to end."""

from __future__ import annotations

import types

import pytest
import torch

from tsspec.runtime.loading import LoadOptions
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import assert_lossless

from .test_target import _float64_exact

pytest.importorskip("tsspec_block")
pytestmark = pytest.mark.oracle

F64 = LoadOptions(dtype="float64")
EPS = 2.0**-20  # exact in the float32 GGUF key
BLOCK = 5
HF_IDS = [0, 2]  # layer outputs; GGUF taps [1, 3]


def make_assistant(*, hidden=64, vocab=96, window=64, seed=7, layers=2):
    """A random HF muse_glimmer_assistant (float64, weights float32-exact), RoPE and norms made
    float64 like the trunk's oracle."""
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    cfg = MuseGlimmerAssistantConfig(
        hidden_size=hidden, intermediate_size=80, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=EPS, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, sliding_window=window,
        block_size=BLOCK, mask_token_id=vocab - 1, target_layer_ids=list(HF_IDS),
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = MuseGlimmerAssistantModel(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(((1.0 if "norm" in name else 0.0) + 0.3 * torch.randn_like(p)).float().double())

    def rotary(self, x, position_ids):
        inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
        emb = torch.cat([position_ids[..., None].double() * inv] * 2, dim=-1)
        return emb.cos(), emb.sin()

    def norm(self, x):  # the epsilon from the config field, not from the module's attributes
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps))

    model.rotary_emb.forward = types.MethodType(rotary, model.rotary_emb)
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(norm, module)
    return model


@pytest.fixture
def pair(tmp_path, helpers):
    """(HF trunk float64, HF assistant, trunk GGUF path, assistant GGUF path), converted through
    the plugin's converters."""
    from tsspec_model_muse_glimmer.convert import convert_assistant

    def build(window=64, seed=0):
        model = _float64_exact(helpers.make_hf_muse(seed, output_multiplier=0.25, qk_scale_factor=3.875))
        trunk = helpers.write_model(tmp_path / f"muse{seed}-{window}.gguf", model)
        assistant = make_assistant(window=window)
        hf_dir = tmp_path / f"assistant{seed}-{window}"
        assistant.save_pretrained(hf_dir)
        drafter = tmp_path / f"dflash{seed}-{window}.gguf"
        convert_assistant(hf_dir, drafter)
        return model, assistant, trunk, drafter

    return build


def _outputs(model, ids, start):
    """transformers' main-model outputs as the generator sees them: hidden states of the rows
    from ``start`` on (the rows the last main-model forward processed)."""
    with torch.no_grad():
        states = model(torch.tensor([list(ids)]), output_hidden_states=True).hidden_states
    return types.SimpleNamespace(hidden_states=tuple(h[:, start:] for h in states))


def _kwargs(length):
    return {"position_ids": torch.arange(length)[None], "attention_mask": torch.ones(1, length, dtype=torch.long)}


@pytest.mark.parametrize("window", [64, 4])
def test_drafts_match_transformers_candidate_generator(pair, window):
    """Two rounds of DFlashTokenCandidateGenerator (prefill, then two accepted drafts) against
    the block plugin's head attached to the Muse-Glimmer trunk; a window of 4 cuts the context."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    from tsspec_block.attach import attach_dflash
    from tsspec_model_muse_glimmer import load_muse_glimmer

    model, assistant, trunk_path, drafter_path = pair(window=window)
    target = load_muse_glimmer(trunk_path, F64)
    head = attach_dflash(target, str(drafter_path), F64)
    assert target.feature_taps == (1, 3)  # trap 3: HF hidden_states[id + 1]
    gen = DFlashTokenCandidateGenerator(assistant, model.get_input_embeddings(), model.get_output_embeddings(),
                                        GenerationConfig(max_length=200, do_sample=False))
    ids = [3, 17, 5, 9, 40, 2, 77, 12, 8, 1, 50]
    p = 10
    ref_ids, ref_logits = gen.get_candidates(torch.tensor([ids]), _kwargs(p + 1), _outputs(model, ids[:p], 0),
                                             is_first_iteration=False, n_last_matches=0)
    _, feats = target.spec_forward(ids[:p], all_logits_rows=True, want_hidden=True)
    head.draft_catch_up(ids[:p], torch.cat([torch.zeros(1, feats.shape[1], dtype=feats.dtype), feats[:-1]]), 0)
    tokens, _ = head.draft_block(ids[p], feats[-1], p, BLOCK - 1)
    assert tokens == ref_ids[0, p + 1 :].tolist()
    assert torch.allclose(head.block_logits(ids[p], p), ref_logits[0], atol=1e-9, rtol=0)

    # round 2: the main model verified [ids[p], d1, d2, ...] and accepted d1, d2; bonus 7
    d1, d2 = tokens[:2]
    seq = ids + [d1, d2]
    ref_ids2, ref_logits2 = gen.get_candidates(torch.tensor([seq + [7]]), _kwargs(len(seq) + 1),
                                               _outputs(model, seq, p), is_first_iteration=False, n_last_matches=2)
    _, feats2 = target.spec_forward(seq[p:], all_logits_rows=True, want_hidden=True)
    head.draft_catch_up(seq[p:], torch.cat([feats[-1:], feats2[:-1]]), p)
    tokens2, _ = head.draft_block(7, feats2[-1], len(seq), BLOCK - 1)
    assert tokens2 == ref_ids2[0, len(seq) + 1 :].tolist()
    assert torch.allclose(head.block_logits(7, len(seq)), ref_logits2[0], atol=1e-9, rtol=0)


def _block_options(drafter=None):
    return SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False, draft_model=drafter)


def test_attaches_from_the_environment_and_from_the_target_file(pair, tmp_path, helpers, monkeypatch):
    from tsspec_model_muse_glimmer import load_muse_glimmer
    from tsspec_model_muse_glimmer.assistant import ENV, carry_drafter

    model, _, trunk_path, drafter_path = pair()
    assert load_muse_glimmer(trunk_path).draft_head is None
    monkeypatch.setenv(ENV, str(drafter_path))
    from_env = load_muse_glimmer(trunk_path)
    assert from_env.draft_head is not None and from_env.feature_taps == (1, 3)
    monkeypatch.delenv(ENV)
    meta, tensors = carry_drafter(str(drafter_path))
    carried_path = helpers.write_model(tmp_path / "carried.gguf", model, extra_metadata=meta, extra_tensors=tensors)
    carried = load_muse_glimmer(carried_path)
    assert carried.draft_head is not None and carried.feature_taps == (1, 3)
    from tsspec.runtime.defaults import default_catalog

    speculators = default_catalog().speculators
    assert speculators.resolve_name(carried, "auto") == "block"  # a carried assistant drives block
    assert speculators.resolve_name(load_muse_glimmer(trunk_path), "auto") == "ngram"
    ids = [3, 17, 5, 9, 40, 2]
    outs = []
    for target in (from_env, carried):
        _, feats = target.spec_forward(ids, all_logits_rows=True, want_hidden=True)
        target.draft_head.draft_catch_up(ids, torch.cat([torch.zeros_like(feats[:1]), feats[:-1]]), 0)
        outs.append(target.draft_head.draft_block(11, feats[-1], len(ids), BLOCK - 1))
    assert outs[0] == outs[1]
    monkeypatch.setenv(ENV, str(tmp_path / "missing.gguf"))
    from tsspec.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="no such file"):
        load_muse_glimmer(trunk_path)


@pytest.mark.parametrize("sampling", [None, SamplingParams(temperature=0.8, top_k=20, seed=7)], ids=["greedy", "seeded"])
def test_block_with_the_assistant_is_lossless(pair, sampling):
    """--draft-model through the runtime's attach, the block algorithm, spec == plain."""
    import tsspec
    from tsspec_block.speculator import make_block_speculator
    from tsspec_model_muse_glimmer import load_muse_glimmer

    _, _, trunk_path, drafter_path = pair(window=4)
    options = _block_options(str(drafter_path))

    def make_speculator(target):
        tsspec.attach_drafter(target, str(drafter_path), LoadOptions())
        return make_block_speculator(target, options)

    _, spec = assert_lossless(lambda: load_muse_glimmer(trunk_path), make_speculator, [5, 9, 2, 3, 17, 8, 4],
                              max_tokens=30, sampling=sampling, options=options)
    assert spec.stats.draft_tokens > 0 and spec.stats.faults == 0


def test_list_speculators_with_the_assistant(pair, capsys):
    """With --draft-model the block algorithm serves the trunk; ngram still does."""
    import json

    from tsspec.cli.app import main

    _, _, trunk_path, drafter_path = pair()
    try:
        main(["list-speculators", "--model", str(trunk_path), "--draft-model", str(drafter_path), "--json"])
    except SystemExit as exc:
        assert not exc.code
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["block"]["status"] == "serves" and rows["ngram"]["status"] == "serves"


def test_without_a_dflash_plugin_a_carried_assistant_is_a_clear_load_error(pair, tmp_path, helpers):
    """The model plugin imports no algorithm plugin: with the block plugin hidden from the
    plugin manager, a plain trunk loads, and one carrying an assistant is a ModelLoadError
    naming the drafter architecture nobody serves (not an ImportError)."""
    from tsspec.errors import ModelLoadError
    from tsspec.plugins import PluginControls, PluginHost
    from tsspec.runtime.catalog import build_catalog
    from tsspec.runtime.loading import load_model
    from tsspec_model_muse_glimmer.assistant import carry_drafter

    model, _, trunk_path, drafter_path = pair()
    meta, tensors = carry_drafter(str(drafter_path))
    carried_path = helpers.write_model(tmp_path / "carried.gguf", model, extra_metadata=meta, extra_tensors=tensors)
    catalog = build_catalog(PluginHost(PluginControls(enabled=frozenset({"muse-glimmer"}))))
    assert "dflash" not in catalog.drafters and "muse-glimmer" in catalog.models
    assert load_model(trunk_path, catalog=catalog).draft_head is None
    with pytest.raises(ModelLoadError, match="no loaded plugin attaches 'dflash' drafters"):
        load_model(carried_path, catalog=catalog)
    with_block = build_catalog(PluginHost(PluginControls(enabled=frozenset({"muse-glimmer", "block"}))))
    assert load_model(carried_path, catalog=with_block).draft_head is not None
