"""Lossless generation with random-weight DFlash / DFlash2 drafters through the shared loop, and
the drafter's context checked against a from-scratch rebuild at every proposal."""

from __future__ import annotations

import pytest
import torch

from tsspec.runtime.execution import SpeculativeExecution
from tsspec.runtime.loading import LoadOptions
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import Sampler, SamplingParams
from tsspec.testing import ToyTarget, assert_lossless

from tsspec_block.attach import attach_dflash
from tsspec_block.speculator import BlockDraftSpeculator, make_block_speculator

TOY = dict(hidden_size=16, target_layers=[1, 2], mask_token_id=31, num_layers=2, block_size=6, sliding_window=8)
DFLASH2 = dict(conv=(3, 4), selector=(4, 5), vocab_size=32, logit_scale=0.5, softcap=5.0)
OPTIONS = SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False)
PROMPT = [1, 2, 3, 4, 5, 6, 7, 3, 4, 5]


@pytest.mark.parametrize("second_gen", [False, True])
@pytest.mark.parametrize("per_row, sampling", [(False, None), (True, SamplingParams(temperature=0.9, top_k=8, seed=11))])
def test_lossless_on_the_toy_target(tmp_path, drafter_file, second_gen, per_row, sampling):
    extra = DFLASH2 if second_gen else {}
    path = drafter_file(tmp_path / "d.gguf", **TOY, **extra)

    def make_speculator(target):
        attach_dflash(target, path)
        return make_block_speculator(target, OPTIONS)

    _, spec = assert_lossless(lambda: ToyTarget(per_row_snapshots=per_row), make_speculator, PROMPT,
                              max_tokens=30, sampling=sampling, options=OPTIONS)
    assert spec.stats.draft_tokens > 0 and spec.stats.faults == 0


class CheckingSpeculator(BlockDraftSpeculator):
    """At every proposal, rebuilds the drafter's context from scratch (a fresh target forward
    over the cached tokens, a fresh head fed every row once) and compares block outputs.

    It runs the head as the block speculator does, but proposes a prefix of the true
    continuation plus one wrong token, so commits of every length (and rejections) occur."""

    def __init__(self, head, make_reference, truth, **kw):
        super().__init__(head, **kw)
        self.make_reference = make_reference
        self.truth = truth  # token ids the plain run emits after the prompt, by position
        self.context_start = 0  # the first position the live drafter may know (after a reuse)
        self.checks = 0

    def propose(self, ctx):
        ref_target, ref_head = self.make_reference()
        cached = list(ctx.history[:-1])  # the tokens in the trunk at positions 0..position-1
        _, feats = ref_target.spec_forward(cached, all_logits_rows=True, want_hidden=True)
        start = self.context_start
        ref_head.inject_rows(torch.arange(start, len(cached)), feats[start:])
        super().propose(ctx)  # feeds the carry row and drafts, exactly as in a real run
        live = self.head.block_hidden(ctx.last_token, ctx.position)
        assert torch.allclose(live, ref_head.block_hidden(ctx.last_token, ctx.position), atol=1e-12, rtol=0)
        assert torch.equal(ctx.carry_hidden, feats[-1])  # the loop's carry is the latest row
        self.checks += 1
        true_next = self.truth.get(ctx.position + 1)
        if true_next is None:
            return []
        keep = self.checks % (ctx.max_tokens + 1)
        drafts = [self.truth.get(ctx.position + 1 + i, 0) for i in range(keep)]
        return drafts + [(drafts[-1] if drafts else true_next) ^ 1][: ctx.max_tokens - keep]


@pytest.mark.parametrize("kind", ["recurrent", "per_row", "kv_only"])
def test_drafter_context_tracks_commits_rollbacks_and_prefix_reuse(tmp_path, drafter_file, kind):
    """recurrent: rollback re-forwards; per_row: snapshots committed; kv_only: KV rewinds, and the
    second turn reuses the cached prefix (the drafter then knows only the new suffix)."""
    path = drafter_file(tmp_path / "d.gguf", **{**TOY, "target_layers": [0, 1] if kind == "kv_only" else [1, 2]},
                        **DFLASH2)

    def make():
        return ToyTarget(per_row_snapshots=kind == "per_row", recurrent=kind != "kv_only")

    def fresh():
        target = make()
        return target, attach_dflash(target, path)

    def plain(prompt, n):
        target = make()
        out = SpeculativeExecution(target, Sampler(SamplingParams()), vocab_size=32).run(prompt, n)
        return {len(prompt) + i: tok for i, tok in enumerate(out)}

    target, head = fresh()
    truth = plain(PROMPT, 25)
    spec = CheckingSpeculator(head, fresh, truth, window=5, min_draft_prob=0.0, feature_size=head.feature_size)
    run = SpeculativeExecution(target, Sampler(SamplingParams()), vocab_size=32,
                               speculator=spec, window=5)
    first = run.run(PROMPT, 25)
    assert first == [truth[len(PROMPT) + i] for i in range(25)]
    hist = run.stats.accepted_per_position
    assert spec.checks > 5 and run.stats.accepted_tokens > 0 and len(hist) >= 3 and hist[2] > 0
    # the next turn shares the whole first conversation: the loop reuses the cached prefix
    turn = PROMPT + first + [9, 8, 7]
    spec.truth = plain(turn, 12)
    reuse = kind == "kv_only"  # only a trunk that can rewind reuses its cached prefix
    spec.context_start = len(PROMPT) + len(first) - 1 if reuse else 0
    before = spec.checks
    run.run(turn, 12)
    assert run.stats.prompt_tokens == len(turn) and spec.checks > before
    assert run.stats.faults == 0


def _tiny_llama(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tsspec_model_llama")
    from tsspec_model_llama import load_llama
    from tsspec_model_llama.convert import write_llama_gguf

    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)  # sharper logits: long agreeing stretches
    path = tmp_path / "llama.gguf"
    write_llama_gguf(path, model)
    return lambda: load_llama(path, LoadOptions(dtype="float64"))


def _tiny_qwen35(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tsspec_model_qwen35")
    from tsspec_gguf.gguf_writer import write_gguf
    from tsspec_model_qwen35.convert import convert_state_dict
    from tsspec_model_qwen35.loader import load_qwen35

    torch.manual_seed(4)
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2, intermediate_size=48,
        max_position_embeddings=128, tie_word_embeddings=False)
    model = transformers.Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and "linear_attn" not in name:
                p.normal_(0.0, 0.3)
    arch, meta, tensors = convert_state_dict(cfg, model.state_dict())
    path = tmp_path / "qwen35.gguf"
    write_gguf(path, arch, meta, tensors)
    return lambda: load_qwen35(str(path), LoadOptions(dtype="float64"))


@pytest.mark.parametrize("model", ["llama", "qwen35"])
def test_lossless_on_real_model_targets(tmp_path, drafter_file, model):
    make_target = _tiny_llama(tmp_path) if model == "llama" else _tiny_qwen35(tmp_path)
    probe = make_target()
    layers = probe.config.num_layers
    path = drafter_file(tmp_path / "d.gguf", hidden_size=32, target_layers=[1, layers // 2 + 1, layers],
                        mask_token_id=63, num_layers=1, block_size=6, sliding_window=16,
                        conv=(2, 8), selector=(4, 6), vocab_size=64)

    def make_speculator(target):
        attach_dflash(target, path)
        return make_block_speculator(target, OPTIONS)

    for sampling in (None, SamplingParams(temperature=0.7, seed=5)):
        _, spec = assert_lossless(make_target, make_speculator, [5, 9, 2, 33, 17, 8, 41], max_tokens=24,
                                  sampling=sampling, options=OPTIONS, check_state=False)
        assert spec.stats.draft_tokens > 0 and spec.stats.faults == 0


class _Proposals:
    """Records each proposal (position, drafts, the drafter's context positions)."""

    def __init__(self, inner):
        self.inner, self.proposals = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, ctx):
        drafts = self.inner.propose(ctx)
        held = self.inner.head._stores[0].positions  # [rows]: the drafter's context positions
        self.proposals.append((ctx.position, list(drafts), sorted(int(p) for p in held if p >= 0)))
        return drafts


@pytest.mark.parametrize("attention", ["sliding", "full"])
@pytest.mark.parametrize("sampling", [None, SamplingParams(temperature=0.9, top_k=8, seed=11)], ids=["greedy", "sampled"])
def test_a_parked_losing_drafter_is_lossless_and_sees_only_its_window(tmp_path, drafter_file, sampling, attention):
    """A random-weight (losing) DFlash drafter under the cost governor is parked; a probe after
    a park injects at most ``catch_up_rows`` rows (a sliding drafter's window; a full-attention
    one here bounded to 4), and the output is plain decoding's."""
    from tsspec.runtime.generation import generate
    from tsspec.runtime.governor import SpeculationCostGovernor
    from tsspec.testing import plain_tokens

    config = dict(TOY) if attention == "sliding" else {k: v for k, v in TOY.items() if k != "sliding_window"}
    bound = TOY["sliding_window"] if attention == "sliding" else 4
    path = drafter_file(tmp_path / "d.gguf", **config)
    prompt, max_tokens = PROMPT * 3, 120
    want = plain_tokens(ToyTarget(seed=3), prompt, max_tokens, sampling=sampling)
    target = ToyTarget(seed=3)
    attach_dflash(target, path)
    spec = _Proposals(make_block_speculator(target, OPTIONS))
    assert spec.inner.catch_up_rows == (bound if attention == "sliding" else 64)
    spec.inner.catch_up_rows = bound
    # a constant clock: the governor parks on zero-accept verifies alone
    governor = SpeculationCostGovernor(initial_backoff=8, max_backoff=32)
    gen = generate(target, prompt, OPTIONS, max_tokens=max_tokens, speculator=spec, sampling=sampling,
                   governor=governor, clock=lambda: 0.0)
    assert gen.tokens == want
    assert gen.stats.governor_losses >= 2 and len(spec.proposals) >= 3
    assert spec.inner.skipped_rows > 0  # the bound dropped the rows before each probe's window
