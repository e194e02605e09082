"""DSpark: block proposals on tiny random drafters == a float64 reference of the equations
(written here, row by row, independently of the plugin's code), every head variant a checkpoint
can carry, both GGUF file conventions, declines, and lossless generation through ``block``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tsspec.errors import ModelLoadError
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import assert_lossless

EPS = 1e-6


def _t(tensors, name):
    return torch.from_numpy(np.asarray(tensors[name], dtype=np.float64))


class Reference:
    """The DSpark equations in float64, one row and one key at a time."""

    def __init__(self, meta, tensors, *, stages, first, taps, top_k=None):
        a = "deepseek4"
        self.m, self.t = meta, tensors
        self.H = meta[f"{a}.embedding_length"]
        self.hc = meta[f"{a}.hyper_connection.count"]
        self.heads = meta[f"{a}.attention.head_count"]
        self.hd = meta[f"{a}.attention.key_length"]
        self.groups = meta[f"{a}.attention.output_group_count"]
        self.window = meta[f"{a}.attention.sliding_window"]
        self.k = top_k or meta[f"{a}.expert_used_count"]
        self.scale = meta[f"{a}.expert_weights_scale"]
        self.limit = meta[f"{a}.swiglu_clamp_exp"]
        self.iters = meta[f"{a}.hyper_connection.sinkhorn_iterations"]
        rd = meta[f"{a}.rope.dimension_count"]
        base = meta[f"{a}.rope.freq_base"]
        self.inv = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
        self.stages = [f"blk.{first + j}." for j in range(stages)]
        self.taps = taps
        self.ctx: dict[int, list] = {}

    def w(self, name):
        return _t(self.t, name)

    @staticmethod
    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * w

    def rope(self, v, pos, inverse=False):
        n = 2 * len(self.inv)
        angles = (torch.tensor(float(pos), dtype=torch.float32) * self.inv).double()
        cos, sin = angles.cos(), angles.sin() * (-1 if inverse else 1)
        out = v.clone()
        for i in range(len(self.inv)):
            a, b = v[..., v.shape[-1] - n + 2 * i], v[..., v.shape[-1] - n + 2 * i + 1]
            out[..., v.shape[-1] - n + 2 * i] = a * cos[i] - b * sin[i]
            out[..., v.shape[-1] - n + 2 * i + 1] = b * cos[i] + a * sin[i]
        return out

    def hyper(self, p, S):
        hc = self.hc
        flat = S.reshape(-1)
        flat = flat / torch.sqrt((flat * flat).mean() + EPS)
        mix = self.w(p + "_fn.weight") @ flat
        b, s = self.w(p + "_base.weight"), self.w(p + "_scale.weight")
        pre = torch.sigmoid(mix[:hc] * s[0] + b[:hc]) + EPS
        post = 2 * torch.sigmoid(mix[hc:2 * hc] * s[1] + b[hc:2 * hc])
        comb = torch.softmax(mix[2 * hc:].view(hc, hc) * s[2] + b[2 * hc:].view(hc, hc), dim=-1) + EPS
        comb = comb / (comb.sum(0, keepdim=True) + EPS)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(1, keepdim=True) + EPS)
            comb = comb / (comb.sum(0, keepdim=True) + EPS)
        return post, comb, (pre[:, None] * S).sum(0)

    def moe(self, p, x):
        scores = torch.sqrt(F.softplus(self.w(p + "ffn_gate_inp.weight") @ x))
        idx = torch.topk(scores + self.w(p + "exp_probs_b.bias"), self.k).indices
        weights = scores[idx] / scores[idx].sum() * self.scale

        def swiglu(g, u, d):
            return d @ (F.silu((g @ x).clamp(max=self.limit)) * (u @ x).clamp(-self.limit, self.limit))

        out = sum(weights[n] * swiglu(self.w(p + "ffn_gate_exps.weight")[e], self.w(p + "ffn_up_exps.weight")[e],
                                      self.w(p + "ffn_down_exps.weight")[e]) for n, e in enumerate(idx.tolist()))
        return out + swiglu(self.w(p + "ffn_gate_shexp.weight"), self.w(p + "ffn_up_shexp.weight"),
                            self.w(p + "ffn_down_shexp.weight"))

    def inject(self, pos, feature):
        c = self.rms(self.w("dspark.fc.weight") @ feature, self.w("dspark.hidden_norm.weight"))
        self.ctx[pos] = [self.rope(self.rms(self.w(p + "attn_kv.weight") @ c, self.w(p + "attn_kv_a_norm.weight")), pos)
                         for p in self.stages]

    def block(self, ids, position):
        B, hc, H = len(ids), self.hc, self.H
        embed = self.w("token_embd.weight")
        S = [embed[i].expand(hc, H).clone() for i in ids]
        ctx_pos = [t for t in range(max(0, position - self.window + 1), position) if t in self.ctx]
        for j, p in enumerate(self.stages):
            mixed = [self.hyper(p + "hc_attn", s) for s in S]
            xs = [self.rms(c, self.w(p + "attn_norm.weight")) for _, _, c in mixed]
            kv = [self.rope(self.rms(self.w(p + "attn_kv.weight") @ x, self.w(p + "attn_kv_a_norm.weight")), position + i)
                  for i, x in enumerate(xs)]
            keys = [self.ctx[t][j] for t in ctx_pos] + kv
            outs = []
            for i, x in enumerate(xs):
                r = self.rms(self.w(p + "attn_q_a.weight") @ x, self.w(p + "attn_q_a_norm.weight"))
                q = (self.w(p + "attn_q_b.weight") @ r).view(self.heads, self.hd)
                q = q / torch.sqrt((q * q).mean(-1, keepdim=True) + EPS)
                q = self.rope(q, position + i)
                o = torch.zeros(self.heads, self.hd, dtype=torch.float64)
                sinks = self.w(p + "attn_sinks.weight")
                for h in range(self.heads):
                    logits = torch.stack([q[h] @ k / math.sqrt(self.hd) for k in keys] + [sinks[h]])
                    probs = torch.softmax(logits, 0)[:-1]
                    o[h] = sum(pr * k for pr, k in zip(probs, keys))
                o = self.rope(o, position + i, inverse=True).reshape(self.groups, -1)
                oa = self.w(p + "attn_output_a.weight").view(self.groups, -1, o.shape[-1])
                mid = torch.cat([oa[g] @ o[g] for g in range(self.groups)])
                outs.append(self.w(p + "attn_output_b.weight") @ mid)
            S = [post[:, None] * a[None] + comb.T @ s for (post, comb, _), a, s in zip(mixed, outs, S)]
            mixed = [self.hyper(p + "hc_ffn", s) for s in S]
            fs = [self.moe(p, self.rms(c, self.w(p + "ffn_norm.weight"))) for _, _, c in mixed]
            S = [post[:, None] * f[None] + comb.T @ s for (post, comb, _), f, s in zip(mixed, fs, S)]
        rows = []
        for s in S:
            flat = s.reshape(-1)
            flat = flat / torch.sqrt((flat * flat).mean() + EPS)
            pre = torch.sigmoid(self.w("dspark.hc_head_fn.weight") @ flat * self.w("dspark.hc_head_scale.weight")[0]
                                + self.w("dspark.hc_head_base.weight")) + EPS
            rows.append(self.rms((pre[:, None] * s).sum(0), self.w("dspark.output_norm.weight")))
        return torch.stack(rows)

    def chain(self, rows, anchor, count, *, head_type, rank, confidence, with_markov, from_anchor):
        head = self.w("output.weight")
        prev, state, tokens, confs = anchor, torch.zeros(rank, dtype=torch.float64), [], []
        for i in (range(count) if from_anchor else range(1, count + 1)):
            x = rows[i]
            logits = head @ x
            emb = None
            if rank:
                emb = self.w("dspark.markov_w1")[prev]
                if head_type == "vanilla":
                    m = emb
                elif head_type == "gated":
                    m = torch.sigmoid(self.w("dspark.markov_gate.weight") @ torch.cat([x, emb])
                                      + self.w("dspark.markov_gate.bias")) * emb
                else:
                    z = self.w("dspark.markov_joint.weight") @ torch.cat([state, emb, x]) + self.w("dspark.markov_joint.bias")
                    g, c, o = torch.sigmoid(z[:rank]), z[rank:2 * rank], z[2 * rank:]
                    state = g * state + (1 - g) * torch.tanh(c)
                    m = torch.tanh(o)
                logits = logits + self.w("dspark.markov_w2") @ m
            token = int(torch.argmax(logits))
            if confidence:
                feat = torch.cat([x, emb]) if with_markov else x
                conf = float(torch.sigmoid(self.w("dspark.confidence_proj")[0] @ feat + self.w("dspark.confidence_proj.bias")[0]))
            else:
                conf = float(torch.softmax(logits, 0)[token])
            tokens.append(token)
            confs.append(conf)
            prev = token
        return tokens, confs


VARIANTS = [
    dict(head_type="vanilla"),
    dict(head_type="gated"),
    dict(head_type="rnn", confidence_with_markov=False),
    dict(head_type="vanilla", sample_from_anchor=False),
    dict(head_type="vanilla", rank=0, confidence=False),
    dict(head_type="gated", experts=2, experts_per_token=1),  # stages with their own expert count
]


def _build(converted, dtype="float64", **kw):
    from tsspec_model_deepseek_v4.loader import load_from_source
    from tsspec_model_deepseek_v4.random_dspark import random_dspark
    from tsspec_model_deepseek_v4.source import MemorySource

    arch, meta, tensors = converted
    a, m, t = random_dspark(meta, tensors, convention="embedded", **kw)
    return (lambda: load_from_source(MemorySource(a, m, t), dtype=dtype)), m, t


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
def test_block_proposals_match_the_float64_reference(converted, sequence, variant):
    make, meta, tensors = _build(converted, **variant)
    target = make()
    head = target.draft_head
    assert head is not None and head.kind.value == "block"
    assert head.w.stages[0].moe.router.shape[0] == variant.get("experts", 4)
    prompt = sequence[:12]
    logits, feats = target.spec_forward(prompt, all_logits_rows=True, want_hidden=True)
    target.spec_keep(len(prompt))
    rows = torch.cat([torch.zeros(1, feats.shape[1], dtype=feats.dtype), feats[:-1]])
    head.draft_catch_up(prompt, rows, 0)
    anchor = int(logits[-1].argmax())
    count = head.drafts_per_pass
    tokens, confs = head.draft_block(anchor, feats[-1], 12, count)

    ref = Reference(meta, tensors, stages=2, first=5, taps=(3, 5), top_k=variant.get("experts_per_token"))
    for pos in range(12):
        ref.inject(pos, feats[pos])
    ref_rows = ref.block([anchor] + [1] * 3, 12)
    assert float((head.block_rows(anchor, 12) - ref_rows).abs().max()) < 1e-9
    want_tokens, want_confs = ref.chain(
        ref_rows, anchor, count, head_type=variant["head_type"], rank=variant.get("rank", 8),
        confidence=variant.get("confidence", True), with_markov=variant.get("confidence_with_markov", True),
        from_anchor=variant.get("sample_from_anchor", True))
    assert tokens == want_tokens
    np.testing.assert_allclose(confs, want_confs, rtol=1e-9, atol=1e-12)
    assert len(tokens) == (4 if variant.get("sample_from_anchor", True) else 3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=2)], ids=["greedy", "sampled"])
def test_dspark_lossless_through_block(converted, sequence, sampling, dtype):
    make, _, _ = _build(converted, dtype, head_type="gated")
    _, spec = assert_lossless(make, lambda t: None, sequence[:10], max_tokens=24, sampling=sampling,
                              options=SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False))
    assert spec.speculator == "block", spec.decline
    assert spec.stats.draft_tokens > 0


@pytest.mark.parametrize("convention", ["sidecar", "dflash"])
def test_separate_files_in_both_conventions(converted, make_target, sequence, tmp_path, convention):
    """The same random drafter as a deepseek4-dspark file and as a dflash file with
    hyper-connections (through the block plugin's attach): the same proposals as embedded."""
    from tsspec_gguf.gguf_writer_util import write_gguf
    from tsspec_model_deepseek_v4.random_dspark import random_dspark

    arch, meta, tensors = converted
    a, m, t = random_dspark(meta, tensors, convention=convention, head_type="rnn")
    path = str(tmp_path / f"dspark-{convention}.gguf")
    write_gguf(path, a, m, t)
    target = make_target(dtype="float64")
    if convention == "dflash":
        from tsspec_block.attach import attach_dflash

        head = attach_dflash(target, path)
    else:
        from tsspec_model_deepseek_v4 import tsspec_register_drafters

        found = []
        tsspec_register_drafters(lambda archs, fn: found.append((archs, fn)))
        (archs, attach), = found
        assert archs == ["deepseek4-dspark"]
        head = attach(target, path, None)
    assert target.draft_head is head and target.spec_feature_size == 2 * 32
    embedded = _build(converted, head_type="rnn")[0]()
    for t_ in (target, embedded):
        logits, feats = t_.spec_forward(sequence[:9], all_logits_rows=True, want_hidden=True)
        t_.draft_head.draft_catch_up(sequence[:9], torch.cat([feats[:1] * 0, feats[:-1]]), 0)
        t_._out = t_.draft_head.draft_block(int(logits[-1].argmax()), feats[-1], 9, 4)
    assert target._out[0] == embedded._out[0]
    np.testing.assert_allclose(target._out[1], embedded._out[1], rtol=1e-12)


def test_declines(converted, make_target, tmp_path):
    from tsspec_gguf.gguf_writer_util import write_gguf
    from tsspec_model_deepseek_v4.dspark import attach_dspark_file
    from tsspec_model_deepseek_v4.random_dspark import random_dspark

    arch, meta, tensors = converted
    a, m, t = random_dspark(meta, tensors, convention="sidecar", rank=0, confidence=True, confidence_with_markov=True)
    path = str(tmp_path / "bad.gguf")
    write_gguf(path, a, m, t)
    with pytest.raises(ModelLoadError, match="markov_rank > 0"):
        attach_dspark_file(make_target(), path)
    a, m, t = random_dspark(meta, tensors, convention="sidecar", head_type="lstm")
    write_gguf(path, a, m, t)
    with pytest.raises(ModelLoadError, match="markov_head_type 'lstm'"):
        attach_dspark_file(make_target(), path)
