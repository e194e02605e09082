"""The MTP head: logits == a float64 reference of DeepSeek's MTPBlock equations built from
transformers' own V4 modules (transformers ignores ``mtp.*`` on load, so there is no model-level
oracle), the folded catch-up == step by step, and lossless generation through draft-head.

The reference runs in float64 but transformers' V4 RMSNorm computes in float32 whatever the
input dtype, so agreement is ~1e-7 relative (TOL 1e-6), not 1e-15."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import assert_lossless

TOL = 1e-6


class MtpReference:
    """float64: S = e_proj(enorm(E x)) + h_proj(hnorm(S_prev)); S' = V4 layer(S) at p with a
    cache; logits = lm_head(norm(hc_head(S')))."""

    def __init__(self, oracle):
        from transformers.cache_utils import DynamicCache

        self.o = oracle
        self.mtp = copy.deepcopy(oracle.mtp).double()
        self.embed = oracle.model.model.embed_tokens.weight.detach().double()
        self.head = oracle.model.lm_head.weight.detach().double()
        self.rotary = copy.deepcopy(oracle.model.model.rotary_emb).double()
        self.cache = DynamicCache(config=oracle.mtp_config)
        self.hc, self.H = oracle.config.hc_mult, oracle.config.hidden_size

    @torch.no_grad()
    def step(self, token: int, s_prev: torch.Tensor, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.mtp
        e = m["enorm"](self.embed[token][None])  # [1, H]
        h = m["hnorm"](s_prev.view(self.hc, self.H))  # [hc, H]
        s = (m["e_proj"](e) + m["h_proj"](h)).view(1, 1, self.hc, self.H)
        ids = torch.tensor([[token]])
        position_ids = torch.tensor([[pos]])
        pe = {k: self.rotary(s[:, :, 0], position_ids=position_ids, layer_type=k) for k in ("main", "compress")}
        out = m["layer"](s, input_ids=ids, position_embeddings=pe, position_ids=position_ids, attention_mask=None,
                         cache=self.cache)
        logits = F.linear(m["norm"](m["hc_head"](out)), self.head)[0, 0]
        return logits, out[0, 0].reshape(-1)


def _trunk_rows(make_target, tokens):
    target = make_target(dtype="float64")
    _, hidden = target.spec_forward(tokens, all_logits_rows=True, want_hidden=True)
    return target, hidden


@pytest.mark.oracle
def test_catch_up_rows_and_chained_steps_match_the_reference(oracle, make_target, sequence):
    tokens = sequence[:20]
    target, rows = _trunk_rows(make_target, tokens)
    head = target.draft_head
    assert head is not None and head.feature_size == rows.shape[1]
    ref = MtpReference(oracle)
    expected = [ref.step(tokens[p], rows[p - 1], p) for p in range(1, len(tokens))]
    commit_rows = torch.cat([torch.zeros(1, rows.shape[1], dtype=rows.dtype), rows[:-1]])
    streams = head._advance(tokens, commit_rows, 0, want_last=True)  # positions 1..19 in one call
    logits = head.logits(streams)
    want = torch.stack([e[0] for e in expected])
    assert float((logits - want).abs().max() / want.abs().max()) < TOL
    # two chained steps: the head's own output streams feed the next step
    token, s = int(want[-1].argmax()), streams[-1].reshape(-1)
    for pos in (20, 21):
        got_logits, s_out = head.draft_step(token, s, pos)
        ref_logits, ref_s = ref.step(token, s, pos)
        assert float((got_logits - ref_logits).abs().max() / ref_logits.abs().max()) < TOL
        assert float((s_out - ref_s).abs().max() / ref_s.abs().max()) < TOL
        token, s = int(ref_logits.argmax()), ref_s


def test_folded_catch_up_equals_separate_calls(make_target, sequence):
    tokens = sequence[:14]
    target, rows = _trunk_rows(make_target, tokens)
    commit_rows = torch.cat([torch.zeros(1, rows.shape[1], dtype=rows.dtype), rows[:-1]])
    fused, _ = target.draft_head.draft_catch_up_and_step(tokens, commit_rows, 0)
    other, _ = _trunk_rows(make_target, tokens)
    other.draft_head.draft_catch_up(tokens[:9], commit_rows[:9], 0)
    other.draft_head.draft_catch_up(tokens[9:13], commit_rows[9:13], 9)
    step, _ = other.draft_head.draft_step(tokens[13], commit_rows[13], 13)
    assert float((fused - step).abs().max()) < 1e-10


def test_transformers_ignores_mtp_weights_on_load():
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4PreTrainedModel

    assert any("mtp" in p for p in DeepseekV4PreTrainedModel._keys_to_ignore_on_load_unexpected)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=4)],
                         ids=["greedy", "sampled"])
def test_mtp_lossless_through_draft_head(make_target, sequence, sampling):
    _, spec = assert_lossless(
        lambda: make_target(dtype="float64"), lambda t: None, sequence[:9], max_tokens=24, sampling=sampling,
        options=SpeculationOptions(spec_type="draft-head", pmin=0.0, adaptive=False),
    )
    assert spec.speculator == "draft-head", spec.decline
    assert spec.stats.draft_tokens > 0
