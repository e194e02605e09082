"""DSpark: DeepSeek V4's block drafter (a ``DraftHead`` of kind BLOCK, served by ``--spec-type block``).

Equations (speculators 0.9.0 ``dspark`` for the heads), for an anchor at
position p and a block of B rows ``[anchor, noise x (B-1)]`` at positions p .. p+B-1::

    encode   c_t   = RMSNorm_enc(W_fc [mean_hc(S^a_t) ; mean_hc(S^b_t) ; ...])    (tapped target layers)
    inject   per stage: K = V = rope(RMSNorm_kv(W_kv c_t)) at position t   -> the stage's context rows
    block    S = hc copies of Emb(block ids); per stage a V4 layer (hyper-connections, MoE) whose
             attention sees the context rows of positions [p - W + 1, p) and ALL block rows
             (non-causal inside the block), with sinks and the sliding RoPE
    rows     x_i = RMSNorm_out(hyper_head(S_i))                      [B, H]
    chain    logits_i = lm_head(x_i) + W2 m_i,   tok_i = argmax logits_i,   prev_{i+1} = tok_i
             m_i = W1[prev_i]                              (vanilla)
                 = sigmoid(W_g [x_i ; W1[prev_i]] + b_g) * W1[prev_i]      (gated)
                 = tanh(o_i), with (g, c, o) = W_j [state ; W1[prev_i] ; x_i] + b_j and
                   state <- sigmoid(g) * state + (1 - sigmoid(g)) * tanh(c)   (rnn, state_0 = 0)
    confidence_i = sigmoid(w_c . [x_i ; W1[prev_i]] + b_c)   (without the W1 part when the file says so;
                   the softmax probability of tok_i when the file has no confidence head)

With ``sample_from_anchor`` (DeepSeek's convention, the default) slot i predicts position p+i+1
and prev_0 is the anchor: B drafts per pass. Without it, slot 0 is not used: slot k predicts
p+k with prev_1 = anchor (B-1 drafts). ``block_size`` is reported as drafts + 1 (the block
algorithm proposes ``block_size - 1`` at most). The block speculator gates the cumulative
product of the confidences with ``--spec-pmin``.

GGUF conventions accepted (see the README for keys and tensor names):

* stages in the MTP slots of the ``deepseek4`` file itself (``deepseek4.dspark.*`` keys, stages
  ``blk.{L + j}``): attached at load;
* a ``deepseek4-dspark`` drafter file (``deepseek4.dspark.*``, ``deepseek4-dspark.dspark.*`` or
  ``dspark.*`` keys; stages ``blk.{j}``), attached with ``--draft-model``;
* a ``dflash`` drafter file with ``dflash.hyper_connection.count > 0`` (``dflash.*`` keys,
  ``fc`` / ``enc.output_norm`` / ``output_norm``), handed over by the block plugin's attach.

Taps: HF ``target_layer_ids`` name layer OUTPUTS; the ``deepseek4`` keys carry those ids (the
tap is id + 1), the ``dflash`` convention stores ``id + 1`` already.

Sequence views: ``for_sequence()`` returns a head over the same weights, config and target
(nothing is copied) with its own context rows (every stage's K = V by position, and which
positions it was given); the ``block`` algorithm drives one view per speculator, so sequences
served at once (each from its own thread) never draft from each other's context. ``close()``
frees a view's context rows (they regrow on the next call); a view's ``counts`` (block passes,
rows) are also added to its head's (the totals over every sequence).
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import attrs
import torch
import torch.nn.functional as F

from tsspec.errors import ModelLoadError
from tsspec.protocols import DraftHeadKind, HeadCounts

from .attention import AttentionWeights, _grow
from .moe import moe
from .ops import hyper_expand, hyper_head, hyper_mix, rms_norm, unit_rms_norm, work_dtype
from .weights import HyperWeights, LayerWeights, Reader

HEAD_TYPES = ("vanilla", "gated", "rnn")
ARCH_SIDECAR = "deepseek4-dspark"


@attrs.frozen
class DSparkConfig:
    block: int  # B: rows of a block pass, anchor included
    noise_token_id: int
    taps: tuple[int, ...]  # target layers whose ENTERING streams are read (0..L)
    stages: int
    markov_rank: int
    head_type: str
    confidence: bool
    confidence_with_markov: bool
    sample_from_anchor: bool
    experts: int | None = None  # the stages' own routed-expert count (None: the trunk's)
    experts_per_token: int | None = None


@attrs.define
class DSparkWeights:
    fc: torch.Tensor  # [H, taps * H]
    enc_norm: torch.Tensor  # [H]
    out_norm: torch.Tensor  # [H]
    hc_head: HyperWeights
    stages: list[LayerWeights]
    markov_w1: torch.Tensor | None = None  # [V, r]
    markov_w2: torch.Tensor | None = None  # [V, r]
    gate_w: torch.Tensor | None = None  # [r, H + r]
    gate_b: torch.Tensor | None = None
    joint_w: torch.Tensor | None = None  # [3r, 2r + H]
    joint_b: torch.Tensor | None = None
    conf_w: torch.Tensor | None = None  # [1, H (+ r)]
    conf_b: torch.Tensor | None = None  # [1]


class _Keys:
    """Metadata lookups across the conventions: the first present key of the candidates."""

    def __init__(self, source: Any, prefixes: Sequence[str]):
        self.source, self.prefixes = source, list(prefixes)

    def get(self, suffix: str, default: Any = None) -> Any:
        for prefix in self.prefixes:
            value = self.source.get(prefix + suffix, None)
            if value is not None:
                return value
        return default


def _as_bool(value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)


def read_config(source: Any, *, convention: str, num_layers: int, vocab: int) -> DSparkConfig:
    """``convention``: 'embedded' / 'sidecar' (DeepSeek keys) or 'dflash'."""
    path = getattr(source, "path", "<memory>")
    if convention == "dflash":
        keys = _Keys(source, ["dflash.", "dflash.dspark."])
        taps = [int(t) for t in list(keys.get("target_layers", []))]
        noise = source.get("tokenizer.ggml.mask_token_id", None)
        noise = keys.get("mask_token_id") if noise is None else noise
        stages = int(keys.get("block_count", 0))
    else:
        arch = source.get("general.architecture")
        keys = _Keys(source, ["deepseek4.dspark.", f"{arch}.dspark.", "dspark."])
        taps = [int(t) + 1 for t in list(keys.get("target_layer_ids", []))]
        noise = keys.get("noise_token_id")
        stages = int(keys.get("stage_count", 0) or keys.get("n_layers", 0) or
                     source.get("deepseek4.nextn_predict_layers", 0) or 0)
    head_type = str(keys.get("markov_head_type", "vanilla")).lower()
    rank = int(keys.get("markov_rank", 0) or 0)
    problems = []
    if noise is None:
        problems.append("no noise / mask token id")
    elif not 0 <= int(noise) < vocab:
        problems.append(f"noise token id {noise} is outside the vocabulary of {vocab}")
    if not taps:
        problems.append("no target layers")
    elif any(not 0 <= t <= num_layers for t in taps):
        problems.append(f"target layers {taps} (as taps) reach outside 0..{num_layers}")
    if head_type not in HEAD_TYPES:
        problems.append(f"markov_head_type {head_type!r} is not one of {', '.join(HEAD_TYPES)}")
    block = int(keys.get("block_size", 0) or 0)
    if block < 2:
        problems.append(f"block_size {block} must be >= 2")
    if stages < 1:
        problems.append("no DSpark stages")
    conf = _as_bool(keys.get("enable_confidence_head"), True)
    with_markov = _as_bool(keys.get("confidence_head_with_markov"), True)
    if conf and with_markov and rank == 0:
        problems.append("confidence_head_with_markov needs markov_rank > 0 (speculators refuses it too)")
    if problems:
        raise ModelLoadError(path, "DSpark drafter: " + "; ".join(problems))
    experts, used = keys.get("expert_count"), keys.get("expert_used_count")
    return DSparkConfig(block=block, noise_token_id=int(noise), taps=tuple(taps), stages=stages, markov_rank=rank,
                        head_type=head_type, confidence=conf, confidence_with_markov=with_markov,
                        sample_from_anchor=_as_bool(keys.get("sample_from_anchor"), True),
                        experts=int(experts) if experts is not None else None,
                        experts_per_token=int(used) if used is not None else None)


_NAMES = {  # (DeepSeek conventions, dflash convention)
    "fc": ("dspark.fc.weight", "fc.weight"),
    "enc_norm": ("dspark.hidden_norm.weight", "enc.output_norm.weight"),
    "out_norm": ("dspark.output_norm.weight", "output_norm.weight"),
}


def _first(source: Any, *names: str) -> str | None:
    return next((n for n in names if source.has_tensor(n)), None)


def read_weights(source: Any, cfg: DSparkConfig, hp, dtype: torch.dtype, *, first_block: int,
                 convention: str, trunk_weights=None) -> DSparkWeights:
    path = getattr(source, "path", "<memory>")
    if cfg.experts is not None or cfg.experts_per_token is not None:  # stages route over their own experts
        hp = attrs.evolve(hp, num_experts=cfg.experts or hp.num_experts,
                          experts_per_token=cfg.experts_per_token or hp.experts_per_token)
    r = Reader(source, hp, dtype)
    H, V, hc = hp.hidden_size, hp.vocab_size, hp.hc_mult
    col = 1 if convention == "dflash" else 0
    fc = r.get(_NAMES["fc"][col], H, len(cfg.taps) * H)
    enc_norm = r.get(_NAMES["enc_norm"][col], H)
    out_name = _NAMES["out_norm"][col]
    if r.has(out_name):
        out_norm = r.get(out_name, H)
    elif trunk_weights is not None:
        out_norm = trunk_weights.final_norm
    else:
        raise ModelLoadError(path, f"missing tensor {out_name!r}")
    if r.has("dspark.hc_head_fn.weight"):
        hc_head = r.hyper("dspark.hc_head", hc, 1)
    elif trunk_weights is not None:
        hc_head = trunk_weights.hc_head
    else:
        raise ModelLoadError(path, "missing tensor 'dspark.hc_head_fn.weight'")
    stages = [r.layer(first_block + j, 0, False, False) for j in range(cfg.stages)]
    w = DSparkWeights(fc=fc, enc_norm=enc_norm, out_norm=out_norm, hc_head=hc_head, stages=stages)
    rank = cfg.markov_rank

    def pick(base: str, *shape: int) -> torch.Tensor:
        name = _first(source, f"dspark.{base}", f"dspark.{base}.weight", base, f"{base}.weight")
        if name is None:
            raise ModelLoadError(path, f"missing tensor 'dspark.{base}'")
        return r.get(name, *shape)

    def bias(base: str, *shape: int) -> torch.Tensor:
        name = _first(source, f"dspark.{base}.bias", f"{base}.bias")
        if name is None:
            raise ModelLoadError(path, f"missing tensor 'dspark.{base}.bias'")
        return r.get(name, *shape)

    if rank:
        w.markov_w1, w.markov_w2 = pick("markov_w1", V, rank), pick("markov_w2", V, rank)
        if cfg.head_type == "gated":
            w.gate_w, w.gate_b = pick("markov_gate", rank, H + rank), bias("markov_gate", rank)
        elif cfg.head_type == "rnn":
            w.joint_w, w.joint_b = pick("markov_joint", 3 * rank, 2 * rank + H), bias("markov_joint", 3 * rank)
    if cfg.confidence:
        width = H + (rank if cfg.confidence_with_markov else 0)
        w.conf_w, w.conf_b = pick("confidence_proj", 1, width), bias("confidence_proj", 1)
    return w


class DSparkHead:
    """The DSpark drafter bound to a ``DeepseekV4Target`` (embedding, LM head, RoPE, MoE code)."""

    kind = DraftHeadKind.BLOCK
    resumes_after_gap = True  # its context rows refill from every commit

    def __init__(self, target: Any, cfg: DSparkConfig, weights: DSparkWeights, *, source: str | None = None):
        self.target = target
        self.trunk = target.trunk
        self.cfg = cfg
        self.w = weights
        self.source = source
        hp = self.trunk.hp
        self.drafts_per_pass = cfg.block if cfg.sample_from_anchor else cfg.block - 1
        self.block_size = self.drafts_per_pass + 1
        self.feature_size = len(cfg.taps) * hp.hidden_size
        self.counts = HeadCounts()  # a view's block passes and rows also add to the head's
        self._new_context()

    def _new_context(self) -> None:
        """Empty context rows: every stage's K = V [positions, hd] and the positions given."""
        hd, dtype = self.trunk.hp.head_dim, self.trunk.dtype
        self._ctx = [torch.zeros(0, hd, dtype=dtype) for _ in self.w.stages]  # [positions, hd]
        self._valid = torch.zeros(0, dtype=torch.bool)  # [positions]

    # -- sequence views -------------------------------------------------------------------------
    def for_sequence(self) -> "DSparkHead":
        """A view for one sequence: the same weights, config and target (nothing copied), its own
        context rows (see the module docstring)."""
        view = copy.copy(self)  # shallow: target, trunk, config and weights shared
        view._new_context()
        view.counts = self.counts.view()
        return view

    def close(self) -> None:
        """Free this head's (or view's) context rows; a later call starts a new sequence."""
        self._new_context()

    # -- DraftHead protocol ---------------------------------------------------------------------
    def reset(self) -> None:
        self._valid.zero_()

    def draft_catch_up(self, tokens: Sequence[int], h_rows: "torch.Tensor | None", start_pos: int) -> None:
        """Row k of ``h_rows`` is the target's feature row of position ``start_pos + k - 1``."""
        if not len(tokens):
            return
        first = int(start_pos) - 1
        if h_rows is None:
            self._forget(max(first, 0), first + len(tokens))
            return
        if h_rows.shape[0] != len(tokens):
            raise ValueError(f"commit of {len(tokens)} tokens came with {h_rows.shape[0]} feature rows")
        self.inject(first, h_rows)

    def draft_block(self, last_token: int, h_prev: "torch.Tensor | None", position: int,
                    max_tokens: int) -> tuple[list[int], list[float]]:
        count = min(int(max_tokens), self.drafts_per_pass)
        if count <= 0:
            return [], []
        if h_prev is not None and position >= 1:
            self.inject(position - 1, h_prev.reshape(1, -1))
        return self.chain(self.block_rows(int(last_token), int(position)), int(last_token), count)

    def draft_step(self, token, h_prev, pos):
        raise NotImplementedError("DSpark is a block head: use draft_block")

    # -- passes ---------------------------------------------------------------------------------
    def _forget(self, lo: int, hi: int) -> None:
        self._valid[lo: max(lo, min(hi, self._valid.shape[0]))] = False

    def inject(self, first: int, features: torch.Tensor) -> None:
        """Encode feature rows [n, taps * H] of positions first.. and write every stage's K = V."""
        if features.shape[-1] != self.feature_size:
            raise ValueError(f"feature rows are {features.shape[-1]} wide, DSpark reads {self.feature_size} "
                             f"({len(self.cfg.taps)} taps x hidden); are the target's feature taps set?")
        if first < 0:
            features, first = features[-first:], 0
        n = features.shape[0]
        if n == 0:
            return
        end = first + n
        self._valid = _grow(self._valid, end)
        present = features.abs().amax(dim=-1) > 0  # an all-zero row: the loop has no row there
        hp, w = self.trunk.hp, self.w
        with torch.no_grad():
            c = rms_norm(F.linear(features.to(self.trunk.dtype), w.fc), w.enc_norm, hp.rms_eps)  # [n, H]
            cos, sin = self.trunk.main_rope.tables(torch.arange(first, end))
            for j, lw in enumerate(w.stages):
                kv = rms_norm(F.linear(c, lw.attn.kv), lw.attn.kv_norm, hp.rms_eps)
                self._ctx[j] = _grow(self._ctx[j], end)
                self._ctx[j][first:end] = self.trunk.main_rope.apply(kv.unsqueeze(1), cos, sin).squeeze(1)
        self._valid[first:end] = present

    def block_rows(self, anchor: int, position: int) -> torch.Tensor:
        """The block pass up to the final norm: x [B, H] for ``[anchor, noise x (B-1)]``."""
        hp, w, cfg = self.trunk.hp, self.w, self.cfg
        self.counts.add(cfg.block)
        ids = torch.full((cfg.block,), cfg.noise_token_id, dtype=torch.long)
        ids[0] = anchor
        positions = torch.arange(position, position + cfg.block)
        lo = max(0, position - hp.sliding_window + 1)
        self._valid = _grow(self._valid, position)
        ctx_pos = torch.arange(lo, position)[self._valid[lo:position]]  # the rows the head was given
        with torch.no_grad():
            streams = self.trunk.embed(ids).unsqueeze(1).expand(-1, hp.hc_mult, -1).contiguous()
            for j, lw in enumerate(w.stages):
                ctx = self._ctx[j][ctx_pos] if ctx_pos.numel() else self._ctx[j].new_zeros(0, hp.head_dim)
                streams = self._stage(lw, streams, ids, positions, ctx)
            collapsed = hyper_head(streams, w.hc_head.fn, w.hc_head.base, w.hc_head.scale,
                                   hc_eps=hp.hc_eps, norm_eps=hp.rms_eps)
            return rms_norm(collapsed, w.out_norm, hp.rms_eps)

    def _stage(self, lw: LayerWeights, streams: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
               ctx: torch.Tensor) -> torch.Tensor:
        hp = self.trunk.hp
        post, comb, x = hyper_mix(streams, lw.hc_attn.fn, lw.hc_attn.base, lw.hc_attn.scale,
                                  iters=hp.hc_iters, hc_eps=hp.hc_eps, norm_eps=hp.rms_eps)
        a = self._attention(lw.attn, rms_norm(x, lw.attn_norm, hp.rms_eps), positions, ctx)
        streams = hyper_expand(streams, a, post, comb)
        post, comb, x = hyper_mix(streams, lw.hc_ffn.fn, lw.hc_ffn.base, lw.hc_ffn.scale,
                                  iters=hp.hc_iters, hc_eps=hp.hc_eps, norm_eps=hp.rms_eps)
        f = moe(lw.moe, rms_norm(x, lw.ffn_norm, hp.rms_eps), ids, top_k=self.cfg.experts_per_token or hp.experts_per_token,
                scoring=hp.scoring, routed_scale=hp.routed_scale, limit=hp.swiglu_limit)
        return hyper_expand(streams, f, post, comb)

    def _attention(self, w: AttentionWeights, x: torch.Tensor, positions: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Non-causal within the block: every block row sees the context rows and every block row."""
        hp, rope = self.trunk.hp, self.trunk.main_rope
        rows, heads, hd = x.shape[0], hp.num_heads, hp.head_dim
        wd = work_dtype(x.dtype)
        cos, sin = rope.tables(positions)
        r = rms_norm(F.linear(x, w.q_a), w.q_a_norm, hp.rms_eps)
        q = rope.apply(unit_rms_norm(F.linear(r, w.q_b).view(rows, heads, hd), hp.rms_eps), cos, sin)
        kv = rope.apply(rms_norm(F.linear(x, w.kv), w.kv_norm, hp.rms_eps).unsqueeze(1), cos, sin).squeeze(1)
        keys = torch.cat([ctx, kv]).to(wd)  # [nk, hd]
        logits = torch.einsum("rhd,kd->rhk", q.to(wd), keys) * (hd ** -0.5)
        sinks = w.sinks.to(wd).view(1, heads, 1).expand(rows, heads, 1)
        combined = torch.cat([logits, sinks], dim=-1)
        probs = torch.softmax(combined - combined.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
        out = torch.einsum("rhk,kd->rhd", probs, keys).to(x.dtype)
        out = rope.apply(out, cos, sin, inverse=True)
        grouped = out.reshape(rows, hp.o_groups, heads * hd // hp.o_groups)
        o_a = w.o_a.view(hp.o_groups, -1, grouped.shape[-1])
        return F.linear(torch.einsum("rgi,goi->rgo", grouped, o_a).reshape(rows, -1), w.o_b)

    def chain(self, rows: torch.Tensor, anchor: int, count: int) -> tuple[list[int], list[float]]:
        """The greedy Markov chain over the block rows [B, H]: (tokens, confidences)."""
        cfg, w = self.cfg, self.w
        slots = range(0, count) if cfg.sample_from_anchor else range(1, count + 1)
        with torch.no_grad():
            base = self.trunk.lm_head(rows)  # [B, V]
            prev = anchor
            state = rows.new_zeros(cfg.markov_rank) if cfg.head_type == "rnn" and cfg.markov_rank else None
            tokens, confs = [], []
            for i in slots:
                x = rows[i]
                logits = base[i]
                emb = None
                if cfg.markov_rank:
                    emb = w.markov_w1[prev]  # [r]
                    if cfg.head_type == "vanilla":
                        m = emb
                    elif cfg.head_type == "gated":
                        m = torch.sigmoid(F.linear(torch.cat([x, emb]), w.gate_w, w.gate_b)) * emb
                    else:
                        g, c, o = F.linear(torch.cat([state, emb, x]), w.joint_w, w.joint_b).chunk(3)
                        g = torch.sigmoid(g)
                        state = g * state + (1 - g) * torch.tanh(c)
                        m = torch.tanh(o)
                    logits = logits + F.linear(m, w.markov_w2)
                token = int(torch.argmax(logits))
                if cfg.confidence:
                    feat = torch.cat([x, emb]) if cfg.confidence_with_markov else x
                    conf = float(torch.sigmoid(F.linear(feat, w.conf_w, w.conf_b))[0])
                else:
                    work = logits.to(work_dtype(logits.dtype))
                    conf = float(torch.exp(work[token] - torch.logsumexp(work, dim=-1)))
                tokens.append(token)
                confs.append(conf)
                prev = token
        return tokens, confs


def _bind(target: Any, cfg: DSparkConfig, weights: DSparkWeights, path: str | None) -> DSparkHead:
    head = DSparkHead(target, cfg, weights, source=path)
    target.spec_set_feature_taps(list(cfg.taps))
    target.draft_head = head
    return head


def attach_embedded_dspark(target: Any, source: Any, dtype: torch.dtype) -> DSparkHead | None:
    """Stages in the MTP slots of the trunk's own file (``deepseek4.dspark.*`` keys)."""
    hp = target.hp
    if not hp.nextn_layers or source.get("deepseek4.dspark.block_size", None) is None:
        return None
    cfg = read_config(source, convention="embedded", num_layers=hp.num_layers, vocab=hp.vocab_size)
    weights = read_weights(source, cfg, hp, dtype, first_block=hp.num_layers, convention="embedded",
                           trunk_weights=target.trunk.w)
    return _bind(target, cfg, weights, getattr(source, "path", None))


def attach_dspark_file(target: Any, gguf_path: str, options: Any = None) -> DSparkHead:
    """A separate DSpark file (``deepseek4-dspark``, or ``dflash`` with hyper-connections)."""
    from tsspec_gguf.gguf_file import GGUFFile

    path = str(gguf_path)
    hp = getattr(target, "hp", None)
    if getattr(getattr(target, "config", None), "architecture", None) != "deepseek4" or hp is None:
        raise ModelLoadError(path, "a DSpark drafter for DeepSeek V4 attaches to a deepseek4 target only")
    with GGUFFile(path) as gf:
        convention = "dflash" if gf.architecture in ("dflash", "dflash-draft") else "sidecar"
        if convention == "dflash":
            count = int(gf.get("dflash.hyper_connection.count", 0) or 0)
            if count != hp.hc_mult:
                raise ModelLoadError(path, f"dflash.hyper_connection.count is {count}, the target has {hp.hc_mult} streams")
        cfg = read_config(gf, convention=convention, num_layers=hp.num_layers, vocab=hp.vocab_size)
        weights = read_weights(gf, cfg, hp, target.trunk.dtype, first_block=0, convention=convention,
                               trunk_weights=target.trunk.w)
    return _bind(target, cfg, weights, path)
