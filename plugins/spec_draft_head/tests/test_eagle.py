"""train-drafter --kind eagle3 end to end on a tiny random llama: the target's own answers made
with their tapped rows, a few training steps, the written file carries its feature layers and
``fc``, attaching sets the target's taps, and generation with it is lossless (greedy and seeded
sampling)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

from tsspec_gguf.identity import identify
from tsspec.runtime.loading import load_model
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import assert_lossless
from tsspec_training.dataset import DataSpec
from tsspec_training.loop import LoopSpec
from tsspec_training.onpolicy import read_cache
from tsspec_training.request import TrainRequest
from tsspec_training.teacher import greedy_answer

sys.path.insert(0, str(Path(__file__).parent))
from tiny_llama import HIDDEN, VOCAB, write_tiny_llama  # noqa: E402

from tsspec_draft_head import make_draft_head  # noqa: E402
from tsspec_draft_head.eagle import train_eagle3  # noqa: E402
from tsspec_draft_head.nextn_file import read_nextn  # noqa: E402
from tsspec_draft_head.nextn_model import NextNConfig, NextNModule  # noqa: E402

TAPS = (0, 1, 2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("eagle")
    model = write_tiny_llama(tmp / "tiny.gguf")
    target = load_model(model, options=SpeculationOptions(enabled=False))
    rng = random.Random(0)
    prompts = tuple(tuple(rng.randrange(VOCAB) for _ in range(4)) for _ in range(16))
    request = TrainRequest(
        model_path=model, out_path=str(tmp / "tiny-eagle.gguf"), kind="eagle3",
        data=DataSpec(answer_tokens=24, cache_dir=str(tmp / "cache"), sequences=prompts),
        loop=LoopSpec(steps=30, lr=3e-3, warmup=3, seed=0, device="cpu", checkpoint=str(tmp / "ckpt.pt"),
                      checkpoint_every=0, log_every=0),
        identity=identify(model).to_json(), draft_vocab=64, unroll=3, batch=4, taps=TAPS,
    )
    summary = train_eagle3(request, target, log=lambda _: None)
    torch.set_num_threads(previous)
    return model, summary, request, target, prompts


def test_the_cache_holds_greedy_and_sampled_answers_with_their_rows(trained):
    model, summary, request, target, prompts = trained
    records = read_cache(Path(request.data.cache_dir) / "onpolicy-v1" / "answers.jsonl")
    assert sorted({r["mode"] for r in records}) == ["greedy", "sample-1"]
    assert len(records) == 2 * len(prompts)
    greedy = {tuple(r["prompt_ids"]): r["answer_ids"] for r in records if r["mode"] == "greedy"}
    # the greedy answers are the target's own (as one-at-a-time decoding gives them)
    for prompt in prompts[:3]:
        assert greedy[prompt] == greedy_answer(target, list(prompt), 24)[: len(greedy[prompt])]
    sampled = {tuple(r["prompt_ids"]): r["answer_ids"] for r in records if r["mode"] != "greedy"}
    assert any(sampled[p] != greedy[p] for p in prompts)


def test_loss_goes_down_and_the_recipe_names_the_taps(trained):
    _, summary, _, _, _ = trained
    losses = [h["loss"] for h in summary["history"]]
    assert len(losses) == 30 and sum(losses[-5:]) < sum(losses[:5])
    assert summary["recipe"]["feature_layers"] == list(TAPS) and summary["recipe"]["unroll"] == 3


def test_the_file_carries_fc_and_its_layers_and_attaching_sets_the_taps(trained):
    model, summary, _, _, _ = trained
    module, _, manifest = read_nextn(summary["path"])
    assert module.cfg.feature_layers == TAPS and module.fc.shape == (HIDDEN, 3 * HIDDEN)
    assert manifest["licenses"]["answers"] and manifest["modes"] == ["greedy", "sample-1"]
    target = load_model(model, draft_model=summary["path"])
    assert target.feature_taps == TAPS and target.spec_feature_size == 3 * HIDDEN


def test_fused_rows_and_own_rows_go_in_by_width():
    cfg = NextNConfig(hidden_size=8, intermediate_size=16, num_heads=2, num_kv_heads=1, head_dim=4,
                      feature_layers=(0, 1, 2))
    m = NextNModule(cfg, 32)
    torch.nn.init.normal_(m.fc)
    taps = torch.randn(5, 24)
    assert torch.allclose(m.fuse(taps), taps @ m.fc.t())
    own = torch.randn(5, 8)
    assert m.fuse(own) is own


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=3)],
                         ids=["greedy", "sampled"])
def test_generation_with_the_eagle_head_is_lossless(trained, sampling):
    model, summary, _, _, _ = trained
    opts = SpeculationOptions(spec_type="draft-head", pmin=0.0, draft=4, adaptive=False)
    _, spec = assert_lossless(
        lambda: load_model(model, draft_model=summary["path"]),
        lambda t: make_draft_head(t, opts),
        [7, 3, 11, 40, 2],
        max_tokens=40,
        sampling=sampling,
        options=opts,
    )
    assert spec.stats.draft_tokens > 0
