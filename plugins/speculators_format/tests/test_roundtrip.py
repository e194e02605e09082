"""A block drafter exported in the speculators format and read back drafts exactly as before, on
20 prompts; the speculators output stays lossless; what the format cannot say fails in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tsspec.runtime.converting import ConvertError, find_converter
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.testing import ToyTarget, assert_lossless

from tsspec_block.attach import attach_dflash
from tsspec_block.random_drafter import random_dflash_metadata, random_dflash_tensors
from tsspec_block.speculator import make_block_speculator
from tsspec_speculators_format.exporter import ExportError, export_block
from tsspec_speculators_format.reader import SpeculatorsFormatError, convert_speculators

TOY = dict(hidden_size=16, target_layers=[1, 2], mask_token_id=31, num_layers=2, block_size=6, sliding_window=8,
           vocab_size=32)
OPTIONS = SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False)
DRAFT_IDS = [7, 3, 30, 12, 1, 25, 9, 18, 4, 22, 15, 28]  # deliberately not sorted


def write_drafter(path, *, draft_vocab=None, **over):
    from tsspec_gguf.gguf_writer import write_gguf

    meta = random_dflash_metadata(**{**TOY, **over})
    tensors = random_dflash_tensors(meta, seed=3)
    if draft_vocab is not None:
        meta["draft_vocab"] = list(draft_vocab)
        rows = ToyTarget().w_out[:, list(draft_vocab)].T  # [K, H]: the target's own head rows
        tensors["output.weight"] = rows.to(torch.float32).numpy()
    metadata = {"tokenizer.ggml.mask_token_id": meta.pop("__mask_token_id__")}
    metadata.update({"dflash." + k: v for k, v in meta.items()})
    write_gguf(path, "dflash", metadata, tensors)
    return path


def prompts(n=20):
    rng = np.random.default_rng(11)
    return [[int(t) for t in rng.integers(1, 31, size=int(rng.integers(4, 12)))] for _ in range(n)]


def drafts_of(path, prompt):
    """The block the drafter proposes after ``prompt`` (its context fed from the target's taps)."""
    target = ToyTarget()
    head = attach_dflash(target, str(path))
    cached = prompt[:-1]  # the trunk holds positions 0 .. len(cached) - 1; the last token anchors
    _, features = target.spec_forward(cached, all_logits_rows=True, want_hidden=True)  # [n, F]
    head.inject_rows(torch.arange(len(cached)), features)
    return head.draft_block(prompt[-1], None, len(cached), head.block_size - 1)[0]


@pytest.mark.parametrize("draft_vocab", [None, DRAFT_IDS])
def test_round_trip_drafts_identical_on_20_prompts(tmp_path, draft_vocab):
    original = write_drafter(tmp_path / "a.gguf", draft_vocab=draft_vocab)
    config = export_block(original, tmp_path / "spec", verifier="tiny/toy", verifier_architectures=["ToyForCausalLM"])
    back = tmp_path / "b.gguf"
    assert convert_speculators(tmp_path / "spec", back) == "dflash"
    assert config["speculators_config"]["verifier"] == {"name_or_path": "tiny/toy", "architectures": ["ToyForCausalLM"]}
    blocks = [drafts_of(original, prompt) for prompt in prompts()]
    assert [drafts_of(back, prompt) for prompt in prompts()] == blocks
    assert all(len(block) == 5 for block in blocks)
    if draft_vocab:  # target ids, never draft-row indices
        assert {t for block in blocks for t in block} <= set(draft_vocab)
    else:
        assert len({tuple(b) for b in blocks}) > 1


def test_schema_of_the_export(tmp_path):
    config = export_block(write_drafter(tmp_path / "a.gguf", draft_vocab=DRAFT_IDS), tmp_path / "spec")
    on_disk = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert on_disk == config
    assert on_disk["speculators_model_type"] == "dflash" and on_disk["architectures"] == ["DFlashDraftModel"]
    assert on_disk["aux_hidden_state_layer_ids"] == [1, 2]  # the GGUF taps: hidden-state indices
    assert on_disk["draft_vocab_size"] == len(DRAFT_IDS) and on_disk["transformer_layer_config"]["vocab_size"] == 32
    assert on_disk["speculators_config"]["proposal_methods"] == [{"proposal_type": "greedy", "speculative_tokens": 5}]
    state = load_file(str(tmp_path / "spec" / "model.safetensors"))
    targets = torch.arange(len(DRAFT_IDS)) + state["d2t"]  # the format's rule: row + offset
    assert targets.tolist() == sorted(DRAFT_IDS)
    assert state["t2d"].nonzero().flatten().tolist() == sorted(DRAFT_IDS)
    assert "embed_tokens.weight" not in state and state["lm_head.weight"].shape == (len(DRAFT_IDS), 16)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_norm.weight"} <= set(state)


def test_converted_drafter_is_lossless(tmp_path):
    export_block(write_drafter(tmp_path / "a.gguf", draft_vocab=DRAFT_IDS), tmp_path / "spec")
    convert_speculators(tmp_path / "spec", tmp_path / "b.gguf")

    def make_speculator(target):
        attach_dflash(target, str(tmp_path / "b.gguf"))
        return make_block_speculator(target, OPTIONS)

    _, spec = assert_lossless(ToyTarget, make_speculator, [1, 2, 3, 4, 5, 6, 7, 3, 4, 5], max_tokens=30, options=OPTIONS)
    assert spec.stats.draft_tokens > 0


def _edit(tmp_path, **changes):
    export_block(write_drafter(tmp_path / "a.gguf", draft_vocab=DRAFT_IDS), tmp_path / "spec")
    path = tmp_path / "spec" / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return tmp_path / "spec"


@pytest.mark.parametrize("kind, piece", [
    ("eagle3", "EAGLE-3 head"), ("dspark", "Markov"), ("medusa", "not one tsspec reads"),
])
def test_unmapped_types_name_the_missing_piece(tmp_path, kind, piece):
    src = _edit(tmp_path, speculators_model_type=kind)
    with pytest.raises(SpeculatorsFormatError, match=piece) as info:
        convert_speculators(src, tmp_path / "b.gguf")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("changes, message", [
    (dict(sample_from_anchor=True), "sample_from_anchor"),
    (dict(sliding_window_non_causal=False), "causal sliding-window"),
    (dict(mask_token_id=None), "no mask_token_id"),
])
def test_unsupported_settings_fail_in_one_line(tmp_path, changes, message):
    with pytest.raises(SpeculatorsFormatError, match=message):
        convert_speculators(_edit(tmp_path, **changes), tmp_path / "b.gguf")


def test_disagreeing_vocabulary_maps_are_refused(tmp_path):
    from safetensors.torch import save_file

    src = _edit(tmp_path)
    state = load_file(str(src / "model.safetensors"))
    state["t2d"] = torch.roll(state["t2d"], 1)
    save_file(state, str(src / "model.safetensors"))
    with pytest.raises(SpeculatorsFormatError, match="d2t and t2d disagree"):
        convert_speculators(src, tmp_path / "b.gguf")


def test_export_refusals(tmp_path):
    with pytest.raises(ExportError, match="logit scale"):
        export_block(write_drafter(tmp_path / "s.gguf", logit_scale=0.5), tmp_path / "o1")
    with pytest.raises(ExportError, match="vocabulary size"):
        export_block(write_drafter(tmp_path / "v.gguf", vocab_size=None), tmp_path / "o2")


def test_convert_finds_the_speculators_converter_first(tmp_path):
    import tsspec_speculators_format as plugin

    src = _edit(tmp_path)
    keys = []
    plugin.tsspec_register_converters(lambda types, fn, **kw: keys.extend((t, fn) for t in types))
    converters = {"DFlashDraftModel": "block", **{k: fn for k, fn in keys}}
    key, entry = find_converter(converters, src)
    assert key == "speculators" and entry is plugin.convert_file
    (src / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    with pytest.raises(ConvertError):
        find_converter({"speculators": plugin.convert_file}, src)
