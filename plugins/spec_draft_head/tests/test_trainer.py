"""train-drafter --kind mtp end to end on a tiny random llama: a few steps, the loss goes down,
the written ``nextn`` GGUF loads, attaches through the drafters hook, drafts, and generation
with it is lossless (greedy and seeded sampling)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import attrs
import pytest
import torch

from tsspec.errors import OptionsError
from tsspec_gguf.identity import identify
from tsspec.runtime.loading import load_model
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import assert_lossless
from tsspec_training.dataset import DataSpec
from tsspec_training.loop import LoopSpec
from tsspec_training.request import TrainRequest
from tsspec_training.teacher import TeacherSequence, greedy_answer, teacher_pass

sys.path.insert(0, str(Path(__file__).parent))
from tiny_llama import VOCAB, write_tiny_llama  # noqa: E402

from tsspec_draft_head import make_draft_head  # noqa: E402
from tsspec_draft_head.nextn_file import NextNFileHead, read_nextn  # noqa: E402
from tsspec_draft_head.nextn_model import NextNModule  # noqa: E402
from tsspec_draft_head.trainer import (  # noqa: E402
    LAYER, WARM, _Batches, _draft_vocabulary, _initialise, _losses, _warm_start, answer_accuracy,
    confidence_weights, evaluate, restarted, train_mtp,
)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One intra-op thread: tiny ops on two contended OpenMP threads run 10x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, _one_torch_thread):
    tmp = tmp_path_factory.mktemp("train")
    model = write_tiny_llama(tmp / "tiny.gguf")
    target = load_model(model, options=SpeculationOptions(enabled=False))
    rng = random.Random(0)
    sequences = []
    for _ in range(24):  # the target's own greedy continuations: what a drafter must learn
        prompt = [rng.randrange(VOCAB) for _ in range(4)]
        sequences.append(tuple(prompt + greedy_answer(target, prompt, 44)))
    request = TrainRequest(
        model_path=model, out_path=str(tmp / "tiny-mtp.gguf"), kind="mtp",
        data=DataSpec(seq_len=64, soft_k=4, cache_dir=str(tmp / "cache"), sequences=tuple(sequences)),
        loop=LoopSpec(steps=40, lr=3e-3, warmup=4, seed=0, device="cpu", checkpoint=str(tmp / "ckpt.pt"),
                      checkpoint_every=20, log_every=0),
        identity=identify(model).to_json(), draft_vocab=64, unroll=2, batch=4, kl_weight=0.5, valid_share=0.2,
        recommended={"pmin": 0.4, "draft_max": 3},
    )
    summary = train_mtp(request, target, log=lambda _: None)
    return model, summary, request


def test_loss_goes_down(trained):
    _, summary, _ = trained
    losses = [h["loss"] for h in summary["history"]]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert set(summary["after"]) == {"acc1", "acc2"}  # one accuracy per unrolled step


def test_written_file_reads_back_with_its_manifest(trained):
    model, summary, request = trained
    module, facts, manifest = read_nextn(summary["path"])
    assert facts["architecture"] == "llama" and facts["vocab_size"] == VOCAB
    assert facts["sha256"] == identify(model).sha256
    assert module.draft_ids.numel() == 64
    assert manifest["sources"][0]["name"] == "given" and manifest["recipe"]["kind"] == "mtp"


def test_attached_head_drafts_inside_its_draft_vocabulary(trained):
    model, summary, _ = trained
    target = load_model(model, draft_model=summary["path"])
    head = target.draft_head
    assert isinstance(head, NextNFileHead)
    h = torch.zeros(target.spec_feature_size)
    logits, out = head.draft_step(5, h, 3)
    assert logits.shape == (VOCAB,) and out.shape == (target.spec_feature_size,)
    allowed = set(head.m.draft_ids.tolist())
    finite = torch.isfinite(logits).nonzero().flatten().tolist()
    assert set(finite) == allowed


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=3)],
                         ids=["greedy", "sampled"])
def test_generation_with_the_trained_head_is_lossless(trained, sampling):
    model, summary, _ = trained
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


def test_the_files_recommended_settings_apply_unless_the_operator_sets_them(trained):
    model, summary, _ = trained
    _, facts, _ = read_nextn(summary["path"])
    assert facts["recommended"] == {"pmin": 0.4, "draft_max": 3}
    target = load_model(model, draft_model=summary["path"])
    spec = make_draft_head(target, SpeculationOptions(spec_type="draft-head"))
    # the file's gate and chain: what the head drafts by
    assert spec.min_draft_prob == pytest.approx(0.4) and spec.chain_limit == 3
    spec = make_draft_head(target, SpeculationOptions(spec_type="draft-head", pmin=0.1, draft=5))
    assert spec.min_draft_prob == pytest.approx(0.1) and spec.chain_limit is None


def _sequence(source: str, length: int, *, token: int, answer_start: int = 0, width: int = 8) -> TeacherSequence:
    rows = torch.arange(length * width, dtype=torch.float32).reshape(length, width)
    return TeacherSequence(source=source, tokens=torch.full((length,), token, dtype=torch.long),
                           hidden=rows.to(torch.float16), labels=torch.arange(length) % VOCAB,
                           answer_start=answer_start)


def test_a_restarted_sequence_keeps_the_trunk_rows_and_moves_the_answer():
    seq = _sequence("chat-answers", 40, token=3, answer_start=20)
    cut = restarted(seq, 10)  # the head's context starts at row 10; row 9 is its predecessor
    assert torch.equal(cut.tokens, seq.tokens[9:]) and torch.equal(cut.hidden, seq.hidden[9:])
    assert torch.equal(cut.labels, seq.labels[9:]) and cut.answer_start == 11


def _draws(answer_share: float, restart_share: float, batch: int = 300):
    data = [_sequence("chat-answers", 64, token=1) for _ in range(10)]
    data += [_sequence("stdlib-docs", 64, token=2) for _ in range(90)]
    embed = torch.arange(VOCAB, dtype=torch.float32)[:, None].repeat(1, 8)  # [V, 8]: row t is all t
    batches = _Batches(data, embed, torch.arange(VOCAB), VOCAB, batch, torch.device("cpu"),
                       answer_share=answer_share, restart_share=restart_share)
    return batches.sample(0, torch.Generator().manual_seed(0))


def test_answer_share_sets_how_often_a_batch_draws_the_chat_answers():
    answers = (_draws(0.5, 0.0)["emb"][:, 0, 0] == 1).float().mean()
    assert 0.4 < answers < 0.6  # 10% of the sequences, half of the draws
    answers = (_draws(0.0, 0.0)["emb"][:, 0, 0] == 1).float().mean()
    assert answers < 0.2


def test_restart_share_cuts_every_drawn_sequence_at_one():
    whole = _draws(0.0, 0.0)
    assert (whole["labels"] != -100).sum(1).min() == 64
    cut = _draws(0.0, 1.0)
    lengths = (cut["labels"] != -100).sum(1)  # [B] real rows per sequence
    assert lengths.max() < 64 and lengths.min() >= 16 and len(set(lengths.tolist())) > 10


def test_answer_accuracy_counts_answer_tokens_and_can_cut_the_heads_context(trained):
    model, summary, request = trained
    module, _, _ = read_nextn(summary["path"])
    module = module.float()
    target = load_model(model, options=SpeculationOptions(enabled=False))
    with torch.inference_mode():
        embed = target.embed(list(range(VOCAB))).float().clone()
    seq = teacher_pass(target, [7, 3, 11, 40, 2] + greedy_answer(target, [7, 3, 11, 40, 2], 40))
    batches = _Batches([seq], embed, module.draft_ids, VOCAB, 1, torch.device("cpu"))
    seq.answer_start = 1  # every row from 1 on: the teacher-forced accuracy of the first step
    assert answer_accuracy(module, batches, [seq], 2)["acc1"] == pytest.approx(evaluate(module, batches, [seq], 2)["acc1"])
    seq.answer_start = 20
    whole = answer_accuracy(module, batches, [seq], 2)
    assert answer_accuracy(module, batches, [seq], 2, context_rows=30) == whole  # the context reaches row 1
    cut = answer_accuracy(module, batches, [seq], 2, context_rows=4)
    assert cut == answer_accuracy(module, batches, [restarted(seq, 16)], 2)
    assert answer_accuracy(module, batches, [_sequence("given", 10, token=1)], 2) == {}  # no answer: nothing counted


def _labelled(source: str, labels: list[int]) -> TeacherSequence:
    seq = _sequence(source, len(labels), token=1)
    seq.labels = torch.tensor(labels)
    return seq


def test_the_draft_vocabulary_is_counted_as_the_batches_draw_the_sources():
    train = [_labelled("chat-answers", [3] * 4)] + [_labelled("stdlib-docs", [1] * 100 + [2] * 90)]
    assert _draft_vocabulary(train, VOCAB, 2, 0.0, []).tolist() == [1, 2]  # every label alike
    assert _draft_vocabulary(train, VOCAB, 2, 0.5, []).tolist() == [1, 3]  # the answers: half the mass
    only_answers = [s for s in train if s.source == "chat-answers"]
    assert _draft_vocabulary(only_answers, VOCAB, 2, 0.5, [5]).tolist() == [3, 5]  # nothing to weigh


def test_a_warm_start_takes_the_trained_layer_and_the_runs_own_head_rows(trained, tmp_path):
    model, summary, request = trained
    target = load_model(model, options=SpeculationOptions(enabled=False))
    warm_request = attrs.evolve(
        request, out_path=str(tmp_path / "warm.gguf"), init_from=summary["path"],
        loop=attrs.evolve(request.loop, steps=2, checkpoint=str(tmp_path / "warm.ckpt")),
    )
    warm = train_mtp(warm_request, target, log=lambda _: None)
    assert warm["recipe"]["init_from"] == Path(summary["path"]).name
    # before its first step the new run drafts as the trained file does (same vocabulary and
    # validation split; the file's f16 rounding aside), not as a fresh head
    assert warm["before"] == pytest.approx(summary["after"], abs=0.01)
    assert warm["before"]["acc1"] != pytest.approx(summary["before"]["acc1"], abs=0.01)
    trained_module, _, _ = read_nextn(summary["path"])
    fresh = NextNModule(trained_module.cfg, VOCAB)
    head = fresh.head.detach().clone()
    _warm_start(fresh, summary["path"])
    assert all(torch.equal(getattr(fresh, n), getattr(trained_module, n).float()) for n in WARM)
    assert torch.equal(fresh.head, head)  # the head rows are the run's own
    with pytest.raises(OptionsError, match="--init-from"):
        _warm_start(fresh, model)  # the target itself is no drafter file


@pytest.mark.parametrize("options", [
    {"ce_weight": 0.0, "kl_weight": 1.0},  # the target's soft top-k labels alone
    {"confident_weight": 1.0},  # positions weighed by the target's top-1 probability
    {"layer_lr_scale": 0.1},  # the copied layer learns at a tenth of the rate
    {"init_layer": 0},  # the target's first layer copied instead of its last
], ids=["soft-labels-only", "confident-weight", "layer-lr-scale", "init-first-layer"])
def test_each_training_option_learns_and_is_recorded(trained, tmp_path, options):
    model, _, request = trained
    target = load_model(model, options=SpeculationOptions(enabled=False))
    run = attrs.evolve(request, out_path=str(tmp_path / "opt.gguf"), **options,
                       loop=attrs.evolve(request.loop, steps=30, checkpoint=str(tmp_path / "opt.ckpt")))
    summary = train_mtp(run, target, log=lambda _: None)
    losses = [h["loss"] for h in summary["history"]]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    _, _, manifest = read_nextn(summary["path"])
    for key, value in options.items():
        assert manifest["recipe"][key] == value


def test_the_first_layer_is_copied_when_asked(trained):
    from tsspec_gguf.gguf_file import GGUFFile

    model, summary, _ = trained
    trained_module, _, _ = read_nextn(summary["path"])
    fresh = NextNModule(trained_module.cfg, VOCAB)
    assert "layer 0" in _initialise(fresh, model, 2, 0, from_target=True, layer=0)
    with GGUFFile(model) as f:
        assert torch.equal(fresh.wq, f.tensor("blk.0.attn_q.weight").float())
        assert not torch.equal(fresh.wq, f.tensor("blk.1.attn_q.weight").float())
    _initialise(fresh, model, 2, 0, from_target=True, layer=-1)  # negative: from the end
    with GGUFFile(model) as f:
        assert torch.equal(fresh.wq, f.tensor("blk.1.attn_q.weight").float())


def test_confidence_weights_follow_the_targets_top1_probability():
    soft = torch.tensor([[[2.0, 0.0], [0.0, 0.0], [float("-inf"), float("-inf")]]])  # [1, 3, 2]: sure, torn, padding
    w = confidence_weights(soft, 1.0)
    assert w[0, 0] == pytest.approx(torch.sigmoid(torch.tensor(2.0)).item()) and w[0, 1] == pytest.approx(0.5)
    assert w[0, 2] == 0.0
    assert confidence_weights(soft, 2.0)[0, 1] == pytest.approx(0.25)


def _tiny_batch(module, top1_logit: torch.Tensor):
    """A batch of 2 sequences of 6 rows whose teacher top-2 logits are (top1_logit, 0) per row."""
    g = torch.Generator().manual_seed(0)
    H = module.cfg.hidden_size
    labels = torch.randint(module.cfg.draft_vocab, (2, 6), generator=g)
    soft_ids = torch.stack([labels, (labels + 1) % module.cfg.draft_vocab], dim=-1)  # [2, 6, 2]
    soft_logits = torch.stack([top1_logit.expand(2, 6), torch.zeros(2, 6)], dim=-1)  # [2, 6, 2]
    return {"emb": torch.randn(2, 6, H, generator=g), "hidden": torch.randn(2, 6, H, generator=g),
            "labels": labels, "soft_ids": soft_ids, "soft_logits": soft_logits}


def test_the_weighted_loss_is_the_plain_one_when_every_position_weighs_alike_and_differs_otherwise(trained):
    _, summary, _ = trained
    module, _, _ = read_nextn(summary["path"])
    module = module.float()
    even = _tiny_batch(module, torch.tensor(1.5))
    plain, _ = _losses(module, even, 2, 0.5)
    weighted, _ = _losses(module, even, 2, 0.5, confident_weight=2.0)
    assert weighted.item() == pytest.approx(plain.item(), rel=1e-5)
    uneven = _tiny_batch(module, torch.linspace(-3, 3, 6))  # [6]: every row its own confidence
    plain, _ = _losses(module, uneven, 2, 0.5)
    weighted, _ = _losses(module, uneven, 2, 0.5, confident_weight=2.0)
    assert weighted.item() != pytest.approx(plain.item(), rel=1e-3)
    # soft labels alone: the hard-label term is gone
    soft_only, _ = _losses(module, even, 1, 1.0, ce_weight=0.0)
    hard_only, _ = _losses(module, even, 1, 0.0)
    both, _ = _losses(module, even, 1, 1.0)
    assert both.item() == pytest.approx(hard_only.item() + soft_only.item(), rel=1e-5)


def test_the_layer_rate_scale_reaches_only_the_layer(trained, tmp_path):
    model, _, request = trained
    target = load_model(model, options=SpeculationOptions(enabled=False))
    moved = {}
    for scale in (1.0, 0.01):
        run = attrs.evolve(request, out_path=str(tmp_path / f"s{scale}.gguf"), layer_lr_scale=scale,
                           loop=attrs.evolve(request.loop, steps=5, checkpoint=str(tmp_path / f"s{scale}.ckpt")))
        summary = train_mtp(run, target, log=lambda _: None)
        module, _, _ = read_nextn(summary["path"])
        fresh = NextNModule(module.cfg, VOCAB)
        fresh.draft_ids.copy_(module.draft_ids)
        _initialise(fresh, model, 2, 0, from_target=True)
        moved[scale] = {n: float((getattr(module, n).detach().float() - getattr(fresh, n).detach()).abs().max()) for n in ("wq", "eh_proj")}
    assert moved[0.01]["wq"] < 0.2 * moved[1.0]["wq"]  # the layer barely moves
    assert moved[0.01]["eh_proj"] > 0.2 * moved[1.0]["eh_proj"]  # the projection learns at its rate
    assert set(LAYER) >= {"wq", "w_down"}
