"""train-drafter --kind dflash end to end on a tiny random llama: a few steps, the loss goes
down, the GGUF it writes is the existing dflash layout (read back by the block plugin's own
loader, with its manifest), its forward in tsspec equals the trained module's, it attaches
through the drafters hook, drafts inside its draft vocabulary, and generation with it is
lossless (greedy and seeded sampling)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

from tsspec_gguf.gguf_file import GGUFFile
from tsspec_gguf.identity import identify
from tsspec.runtime.loading import load_model
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import assert_lossless
from tsspec_training.dataset import DataSpec
from tsspec_training.loop import LoopSpec
from tsspec_training.request import TrainRequest
from tsspec_training.teacher import greedy_answer

from tsspec_block.attach import attach_dflash
from tsspec_block.config import config_from_gguf
from tsspec_block.head import DFlashDraftHead
from tsspec_block.speculator import make_block_speculator
from tsspec_block.trainable import read_manifest
from tsspec_block.trainer import train_dflash
from tsspec_block.weights import weights_from_gguf

sys.path.insert(0, str(Path(__file__).parent))
from tiny_target import SHAPE, write_tiny_target  # noqa: E402

STEPS, BLOCK, DRAFT_VOCAB, TAPS = 40, 4, 64, (1, 3)
OPTIONS = SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Trained once per module, on one torch thread (conftest's autouse fixture is per test)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield _train(tmp_path_factory.mktemp("train-dflash"))
    finally:
        torch.set_num_threads(previous)


def _train(tmp):
    model = write_tiny_target(tmp / "tiny.gguf")
    target = load_model(model, options=SpeculationOptions(enabled=False))
    rng = random.Random(0)
    sequences = []
    for _ in range(20):  # the target's own greedy continuations: what verification accepts
        prompt = [rng.randrange(SHAPE["vocab"]) for _ in range(4)]
        sequences.append(tuple(prompt + greedy_answer(target, prompt, 44)))
    request = TrainRequest(
        model_path=model, out_path=str(tmp / "tiny-dflash.gguf"), kind="dflash",
        data=DataSpec(seq_len=48, cache_dir=str(tmp / "cache"), sequences=tuple(sequences)),
        loop=LoopSpec(steps=STEPS, lr=3e-3, warmup=4, seed=0, device="cpu", checkpoint=str(tmp / "ckpt.pt"),
                      checkpoint_every=20, log_every=0),
        identity=identify(model).to_json(), layers=1, block_size=BLOCK, taps=TAPS, draft_vocab=DRAFT_VOCAB,
        batch=4, outtype="f32", valid_share=0.2,
    )
    summary = train_dflash(request, target, log=lambda _: None)
    return model, summary, sequences


def test_loss_goes_down_and_validation_improves(trained):
    _, summary, _ = trained
    losses = [h["loss"] for h in summary["history"]]
    assert len(losses) == STEPS
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert set(summary["after"]) == {"acc1", "acc2", "acc3", "accepted"}  # one accuracy per drafted row
    assert summary["after"]["acc1"] > summary["before"]["acc1"]


def test_written_file_is_the_dflash_layout_with_its_manifest(trained):
    model, summary, _ = trained
    with GGUFFile(summary["path"]) as f:
        assert f.architecture == "dflash"
        cfg = config_from_gguf(f)
        assert f.get("dflash.target.sha256") == identify(model).sha256
    assert cfg.target_layers == TAPS and cfg.block_size == BLOCK and cfg.num_layers == 1
    assert cfg.draft_vocab_size == DRAFT_VOCAB and cfg.mask_token_id == summary["recipe"]["mask_token_id"]
    manifest = read_manifest(summary["path"])
    assert manifest["sources"][0]["name"] == "given" and manifest["recipe"]["kind"] == "dflash"
    assert manifest["recipe"]["taps"] == list(TAPS)


def test_tsspec_forward_of_the_file_equals_the_trained_module(trained):
    """The exported GGUF, loaded by the block plugin, computes what the trainer optimised."""
    model, summary, sequences = trained
    module = summary["module"]
    target = load_model(model, options=SpeculationOptions(enabled=False))
    target.spec_set_feature_taps(list(TAPS))
    tokens = list(sequences[0][:30])
    _, feats = target.spec_forward(tokens, all_logits_rows=True, want_hidden=True)  # [30, taps*H]
    with GGUFFile(summary["path"]) as f:
        cfg = config_from_gguf(f)
        head = DFlashDraftHead(cfg, weights_from_gguf(f, cfg), target, native=False)  # the torch reference
    embed = target.embed(list(range(SHAPE["vocab"])))
    anchors = torch.tensor([[5, 17, 29]])
    with torch.no_grad():
        rows = module(feats[None].float(), torch.tensor([tokens]), anchors, embed)  # [1, 3, B, H]
        want = module.logits(rows[0, :, 1:])  # [3, B-1, K]
    for n, a in enumerate(anchors[0].tolist()):
        head.reset()
        head.inject_rows(torch.arange(a), feats[:a])
        got = head.block_hidden(tokens[a], a)  # [B, H]
        assert torch.allclose(got, rows[0, n], atol=1e-5, rtol=1e-5)
        full = head.block_logits(tokens[a], a)  # [B-1, vocab], -inf outside the draft vocabulary
        assert torch.allclose(full[:, module.draft_ids], want[n], atol=1e-4, rtol=1e-5)


def test_attached_drafter_drafts_inside_its_draft_vocabulary(trained):
    model, summary, _ = trained
    target = load_model(model, draft_model=summary["path"])
    head = target.draft_head
    assert isinstance(head, DFlashDraftHead) and head.block_size == BLOCK
    assert target.spec_feature_size == len(TAPS) * SHAPE["hidden"]
    _, feats = target.spec_forward([3, 5, 7, 9], all_logits_rows=True, want_hidden=True)
    head.draft_catch_up([3, 5, 7, 9], feats, 1)
    tokens, confidences = head.draft_block(11, None, 4, BLOCK - 1)
    allowed = set(summary["module"].draft_ids.tolist())
    assert len(tokens) == BLOCK - 1 and set(tokens) <= allowed and all(0 < c <= 1 for c in confidences)


@pytest.mark.parametrize("sampling", [None, SamplingParams(temperature=0.8, top_k=20, seed=3)],
                         ids=["greedy", "sampled"])
def test_generation_with_the_trained_drafter_is_lossless(trained, sampling):
    model, summary, sequences = trained

    def make_speculator(target):
        attach_dflash(target, summary["path"])
        return make_block_speculator(target, OPTIONS)

    _, spec = assert_lossless(lambda: load_model(model, options=SpeculationOptions(enabled=False)), make_speculator,
                              list(sequences[1][:6]), max_tokens=40, sampling=sampling, options=OPTIONS)
    assert spec.stats.draft_tokens > 0
    if sampling is None:  # trained on these greedy continuations: it must draft some of them right
        assert spec.stats.accepted_tokens > 0


def _request(tmp_path, model, **changes):
    base = dict(model_path=model, out_path=str(tmp_path / "d.gguf"), kind="dflash",
                data=DataSpec(seq_len=16, cache_dir=str(tmp_path / "cache"), sequences=((1, 2, 3, 4) * 4,)),
                loop=LoopSpec(steps=1, device="cpu", checkpoint=None, log_every=0), identity={"sha256": "x"})
    return TrainRequest(**{**base, **changes})


@pytest.mark.parametrize("changes, words", [({"taps": (1, 9)}, "--taps [1, 9]: layer 9 is outside 0..3"),
                                            ({"block_size": 1}, "--block-size must be at least 2"),
                                            ({"kl_weight": 0.5, "init_layer": 0},
                                             "--kl-weight, --init-layer: options of the per-token head trainer")])
def test_bad_settings_are_one_line_option_errors(tmp_path, changes, words):
    from tsspec.errors import OptionsError

    model = write_tiny_target(tmp_path / "tiny.gguf")
    target = load_model(model, options=SpeculationOptions(enabled=False))
    with pytest.raises(OptionsError, match=words.replace("[", r"\[").replace("]", r"\]")):
        train_dflash(_request(tmp_path, model, **changes), target, log=lambda _: None)
    assert not (tmp_path / "d.gguf").exists()


def test_a_draft_vocabulary_is_checked_against_the_selector_and_the_target(trained, tmp_path):
    import attrs

    from tsspec.errors import ModelLoadError
    from tsspec_block.attach import check_fit
    from tsspec_block.config import check_config

    model, summary, _ = trained
    cfg = summary["config"]

    def fail(problem):
        return ModelLoadError("d.gguf", problem)

    with pytest.raises(ModelLoadError, match="selector cannot be combined"):
        check_config(attrs.evolve(cfg, selector_rank=4, selector_top_k=2), fail)
    with pytest.raises(ModelLoadError, match="distinct"):
        check_config(attrs.evolve(cfg, draft_vocab=(1, 1, 2)), fail)
    target = load_model(model, options=SpeculationOptions(enabled=False))
    with pytest.raises(ModelLoadError, match="outside the target's vocabulary of 128"):
        check_fit(attrs.evolve(cfg, draft_vocab=(1, 500)), target, "d.gguf")


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_smaller_outtypes_load_and_stay_close(trained, tmp_path, outtype):
    from tsspec_block.trainable import write_trained_dflash

    model, summary, sequences = trained
    path = write_trained_dflash(tmp_path / f"d-{outtype}.gguf", summary["module"], target={"architecture": "llama"},
                                outtype=outtype)
    target = load_model(model, draft_model=str(path))
    exact = load_model(model, draft_model=summary["path"])
    tokens = list(sequences[2][:20])
    rows = []
    for t in (target, exact):
        _, feats = t.spec_forward(tokens, all_logits_rows=True, want_hidden=True)
        t.draft_head.inject_rows(torch.arange(19), feats[:19])
        rows.append(t.draft_head.block_hidden(tokens[19], 19))
    assert Path(path).stat().st_size < Path(summary["path"]).stat().st_size
    assert torch.allclose(rows[0], rows[1], atol=0.1, rtol=0.05)


def test_the_dflash_kind_is_registered_through_the_trainers_hook():
    from tsspec.plugins import PluginHost
    from tsspec.runtime.catalog import build_catalog

    import tsspec_block

    host = PluginHost()
    host.register(tsspec_block, "block")
    entry = build_catalog(host, discover=False).trainers["dflash"]
    assert entry.plugin == "block" and "block-diffusion" in entry.description
