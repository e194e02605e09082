"""draft-head on the Qwen 3.5 MTP head (tsspec-model-qwen35), tiny random weights in float64.

The model comes from a tiny random Hugging Face Qwen 3.5 (plus an HF ``MtpLayer`` for the NextN
weights, which HF itself does not load), converted and loaded through the plugin's own
``convert_state_dict`` / ``MemorySource`` / ``load_from_source``. Random weights draft badly, so
these tests are about losslessness and head-call accounting; acceptance on a trained head comes
with the trained-drafter work.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

pytest.importorskip("tsspec_model_qwen35")
pytest.importorskip("transformers")

from tsspec.runtime.generation import draft_window, generate  # noqa: E402
from tsspec.runtime.options import SpeculationOptions  # noqa: E402
from tsspec.runtime.sampling import SamplingParams  # noqa: E402
from tsspec.testing import assert_lossless  # noqa: E402
from tsspec_draft_head import FOLD_ENV, make_draft_head  # noqa: E402

VOCAB = 64
CONFIG = dict(  # the smallest config with both layer kinds and num_k_heads != num_v_heads
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2,
    max_position_embeddings=256, rms_norm_eps=1e-6, intermediate_size=48, tie_word_embeddings=False,
)
PROMPT = [5, 17, 3, 42, 8, 8, 61, 2, 30]
MAX_TOKENS = 24
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.8, top_k=16, seed=4)


def _redraw(module: torch.nn.Module, gen: torch.Generator) -> None:
    """O(1) activations instead of HF's tiny init, so distributions are not near-uniform."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.3, 3.0, generator=gen).log())
            elif "norm" in name or name.endswith("dt_bias"):
                p.copy_((1.0 if name.endswith("linear_attn.norm.weight") else 0.0) + 0.3 * noise)
            elif "embed" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]))


@pytest.fixture(scope="module")
def converted():
    """(arch, metadata, tensors): a tiny random qwen35 with one NextN / MTP block."""
    import transformers
    from transformers.modeling_layers import MtpLayer
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m35

    from tsspec_model_qwen35.convert import convert_state_dict

    gen = torch.Generator().manual_seed(0)
    config = transformers.Qwen3_5TextConfig(**CONFIG)
    config._attn_implementation = "eager"
    model = transformers.Qwen3_5ForCausalLM(config).eval()
    mtp_config = copy.deepcopy(config)
    mtp_config.layer_types = ["full_attention"]
    mtp = MtpLayer(mtp_config, m35.Qwen3_5DecoderLayer, m35.Qwen3_5RMSNorm, 0, use_post_norm=True).eval()
    _redraw(model, gen)
    _redraw(mtp, gen)
    state = dict(model.state_dict())
    rename = {"eh_proj.": "mtp.fc.", "enorm.": "mtp.pre_fc_norm_embedding.", "hnorm.": "mtp.pre_fc_norm_hidden.",
              "post_norm.": "mtp.norm.", "mtp_block.": "mtp.layers.0."}
    for key, value in mtp.state_dict().items():
        prefix = next(p for p in rename if key.startswith(p))
        state[rename[prefix] + key[len(prefix):]] = value
    return convert_state_dict(config, state)


@pytest.fixture
def make_target(converted):
    from tsspec_model_qwen35.loader import load_from_source
    from tsspec_model_qwen35.source import MemorySource

    def make(per_row_snapshots: bool = True):
        arch, meta, tensors = converted
        return load_from_source(MemorySource(arch, meta, tensors), dtype="float64",
                                per_row_snapshots=per_row_snapshots)

    return make


@pytest.mark.parametrize(  # pairwise: each rollback path, sampling mode and fold mode twice
    "snapshots, sampling, fold",
    [(True, GREEDY, True), (True, SAMPLED, False), (False, GREEDY, False), (False, SAMPLED, True)],
    ids=["snapshots-greedy-fold", "snapshots-sampled-nofold", "restore-greedy-nofold", "restore-sampled-fold"],
)
def test_lossless_with_the_mtp_head(make_target, snapshots, sampling, fold, monkeypatch):
    monkeypatch.setenv(FOLD_ENV, "1" if fold else "0")
    options = SpeculationOptions(adaptive=False, pmin=0.0)  # random weights: draft anyway
    made = []

    def make_speculator(target):
        made.append(make_draft_head(target, options))
        return made[-1]

    _, spec = assert_lossless(lambda: make_target(snapshots), make_speculator, PROMPT,
                              max_tokens=MAX_TOKENS, sampling=sampling, options=options)
    assert spec.speculator == "draft-head" and spec.stats.faults == 0
    assert spec.stats.draft_tokens > 0 and made[0].fold_catch_up is fold


def test_mtp_head_is_served_and_folding_saves_its_catch_up_calls(make_target, monkeypatch):
    runs = {}
    for fold in (True, False):
        monkeypatch.setenv(FOLD_ENV, "1" if fold else "0")
        target = make_target()
        assert target.draft_head is not None and target.draft_head.resumes_after_gap is False
        options = SpeculationOptions(adaptive=False, pmin=0.0)
        speculator = make_draft_head(target, options)
        assert draft_window(options, target, speculator) == target.spec_preferred_draft_window
        assert speculator.can_arm_after_prefix_reuse is False
        gen = generate(target, PROMPT, options, max_tokens=MAX_TOKENS, speculator=speculator)
        runs[fold] = (gen, speculator.counters, target.draft_head.counts.calls)
    (gen_f, c_f, calls_f), (gen_u, c_u, calls_u) = runs[True], runs[False]
    assert gen_f.tokens == gen_u.tokens
    assert (gen_f.stats.draft_tokens, gen_f.stats.accepted_tokens) == (gen_u.stats.draft_tokens, gen_u.stats.accepted_tokens)
    # folded: every head call is a draft-chain step (the first one carries the catch-up)
    assert c_f.catch_ups == 0 and calls_f == c_f.steps + c_f.fused == c_f.drafted + c_f.gate_stops
    # unfolded: the same steps plus a catch-up call per commit
    assert calls_u == c_u.steps + c_u.catch_ups and c_u.catch_ups > 0
    assert calls_u - calls_f == c_u.catch_ups
