"""DFlashDraftHead: the DFlash / DFlash2 block drafter attached to a target (a DraftHead, BLOCK).

Three passes (the specification's "DFlash and DFlash2")::

    A  encode   c = RMSNorm(fc @ concat(target residuals entering dflash.target_layers))
    B  inject   per layer K = rope(k_norm(W_k c)), V = W_v c  -> ring[pos % rows]
                (no Q, no attention, no FFN: committed context only feeds keys and values)
    C  draft    x = embed([anchor, MASK x (B-1)]) at positions p .. p+B-1; per layer
                h = RMSNorm(x); attention over [ring window | block], NON-causal in the block;
                x += W_o attn; x += SwiGLU(RMSNorm(x)); final norm; the TARGET's LM head on
                rows 1.., argmax per row (or DFlash2's selector walk)

DFlash2 adds a grouped dynamic conv around each sublayer (``ops.grouped_dynamic_conv``) and the
candidate selector (``selector``); both are keyed off the file and are no-ops when absent.

A file with a draft vocabulary (``dflash.draft_vocab``, written by ``tsspec train-drafter --kind
dflash``) carries its own LM-head rows for those K tokens: pass C then scores K tokens instead of
the target's whole vocabulary, and tokens outside it are never proposed (verification is
unchanged). Full-vocabulary views (``draft_step``, ``block_logits``) hold -inf outside it.

Device: the drafter runs where its target runs (``target.device``, CPU by default). Registered
kernels for that device (``kernels``: {op: callable}) replace, where present and the drafter
computes in float32: pass B (``dflash_inject``, one launch for every layer), pass C's attention
over ring + block (``dflash_block_attention``) and grouped conv (``dflash_grouped_conv``), and
the selector's lattice (``selector_lattice``: only k + k*k*(n-1) scores come back to the host
walk). Otherwise the same code runs the torch ops below.

Sequences: the head's context (the K/V stores, what was injected last) is one sequence's.
``for_sequence()`` makes a view over the same weights with stores of its own; the ``block``
algorithm drives one view per speculator, so sequences served at once keep their own context.
A view's ``counts`` (block passes, rows) are also added to its head's (totals over every sequence).

Feature rows (the commit contract): ``h_rows[k]`` is the target's tapped row of position
``start_pos + k - 1``; ``h_prev`` in ``draft_block`` is the row of ``position - 1``, the latest
cached position. The drafter's context is exactly the set of positions it was given, so a gap
(a reused prefix) only shortens its context and a rewind only overwrites it.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from tsspec.protocols import DraftHeadKind, HeadCounts

from .config import DFlashConfig
from .kv_ring import ContextKV
from .ops import block_attention, grouped_dynamic_conv, logit_transform, rms_norm, rope_neox, swiglu
from .selector import select_tokens, walk_lattice
from .weights import ConvWeights, DFlashWeights, LayerWeights, map_weights

__all__ = ["DFlashDraftHead"]

NATIVE_OP = "cpu_int8_matrices"  # the name kernels_in_use reports for the native pass
NATIVE_ENV = "TS_DFLASH_NATIVE"  # "0": the torch reference path even where the kernels can run
INJECT_MAX_ROWS = 32  # rows one fused inject launch takes (commits are k+1 rows; prefills go in torch)


class DFlashDraftHead:
    """A DFlash drafter bound to one target; borrows its embedding and LM head."""

    kind = DraftHeadKind.BLOCK
    resumes_after_gap = True  # its ring refills from every commit

    def __init__(
        self,
        config: DFlashConfig,
        weights: DFlashWeights,
        target: Any,
        *,
        use_conv: bool = True,
        use_selector: bool = True,
        dtype: torch.dtype = torch.float32,
        source: str | None = None,
        kernels: dict | None = None,
        native: bool | None = None,
    ):
        self.config = config
        self.device = torch.device(getattr(target, "device", None) or "cpu")
        self.weights = map_weights(weights, lambda t: t.to(self.device, dtype))
        self.target = target
        self.block_size = config.block_size
        self.dtype = dtype
        self.source = source  # the drafter file, for records
        self.use_conv = bool(use_conv and config.has_conv)
        self.use_selector = bool(use_selector and config.has_selector and weights.selector is not None)
        self._scale = config.head_dim**-0.5
        self.counts = HeadCounts()
        self._new_context()
        self._target_dtype: torch.dtype | None = None  # dtype of the target's embedding rows
        self.ops = dict(kernels or {}) if dtype == torch.float32 else {}  # the fused ops need float32
        self._draft_ids = (  # [K] target ids of the draft-vocabulary rows, or None
            torch.tensor(config.draft_vocab, dtype=torch.long, device=self.device) if config.draft_vocab else None
        )
        self.kernels_used: set[str] = set()
        # the matrices on the compiled CPU kernels as int8 blocks (native_pass.py); None: torch.
        # native None: wherever supported unless TS_DFLASH_NATIVE=0; False: never; True: required
        self.native = self._native_pass(native)

    def _native_pass(self, wanted: bool | None):
        from tsspec.switches import switch_on

        from .native_pass import NativeBlockPass, supports

        if wanted is False or (wanted is None and not switch_on(NATIVE_ENV)):
            return None
        if not supports(self.config, self.weights, dtype=self.dtype, device=self.device, use_conv=self.use_conv):
            if wanted:
                raise ValueError("the compiled kernels cannot run this drafter (not built, not a float32 CPU "
                                 "drafter, a DFlash2 convolution, or matrices not in whole 32-weight blocks)")
            return None
        return NativeBlockPass(self.config, self.weights)

    def _new_context(self) -> None:
        """Fresh sequence state: empty K/V stores per layer, nothing injected."""
        config = self.config
        self._stores = [
            ContextKV(
                config.n_head_kv,
                config.head_dim,
                config.value_dim,
                rows=config.ring_rows if config.layer_is_sliding(i) else None,
                dtype=self.dtype,
                device=self.device,
            )
            for i in range(config.num_layers)
        ]
        self._seen_end = 0  # one past the highest position injected
        self._last_row: tuple[int, torch.Tensor] | None = None  # (position, feature row) injected last

    def for_sequence(self) -> "DFlashDraftHead":
        """A view for one sequence: the same weights, ops and target (nothing copied), its own
        K/V stores and positions. ``kernels_in_use`` stays shared (it records what ran)."""
        view = copy.copy(self)  # shallow: config, weights, ops and the kernels_used set shared
        view._new_context()
        view.counts = self.counts.view()
        return view

    def close(self) -> None:
        """Free this head's (or view's) context stores; a later call starts a new sequence."""
        self._new_context()

    # -- DraftHead protocol ----------------------------------------------------------------
    @property
    def feature_size(self) -> int:
        return self.config.feature_size

    @property
    def kernels_in_use(self) -> list[str]:
        """Registered device ops that have run (``generate --stats`` prints them)."""
        return sorted(self.kernels_used)

    def _op(self, name: str):
        """A registered op by name, recorded as used, or None (the torch path)."""
        op = self.ops.get(name)
        if op is not None:
            self.kernels_used.add(name)
        return op

    def reset(self) -> None:
        for store in self._stores:
            store.clear()
        self._seen_end = 0
        self._last_row = None

    def draft_catch_up(self, tokens: Sequence[int], h_rows: "torch.Tensor | None", start_pos: int) -> None:
        """Inject the feature rows of a commit: row k is position ``start_pos + k - 1``."""
        count = len(tokens)
        if count == 0:
            return
        first = start_pos - 1
        if h_rows is None:
            self._forget_from(max(first, 0))  # what the drafter had there is no longer the sequence
            self._seen_end = max(first, 0)
            return
        if h_rows.shape[0] != count:
            raise ValueError(f"commit of {count} tokens came with {h_rows.shape[0]} feature rows")
        self._inject(first, h_rows)

    def draft_block(
        self, last_token: int, h_prev: "torch.Tensor | None", position: int, max_tokens: int,
    ) -> tuple[list[int], list[float]]:
        """Up to ``min(max_tokens, block_size - 1)`` drafts after ``last_token`` at ``position``."""
        count = min(int(max_tokens), self.block_size - 1)
        if count <= 0:
            return [], []
        if h_prev is not None and position >= 1:
            self._inject(position - 1, h_prev.reshape(1, -1))
        if self.native is not None and not self.use_selector:
            # only the rows asked for leave the last layer
            state = self._native_block(last_token, position)
            return self._argmax_rows(self.native.finish(state, 1, 1 + count))
        hidden = self.block_hidden(last_token, position)  # [B, H]
        rows = hidden[1 : 1 + count]  # [n, H]: row i predicts the token at position + i
        if not self.use_selector:
            return self._argmax_rows(rows)
        logits = self._scores(rows)  # [n, vocab] (the selector reads the whole vocabulary)
        transformed = logit_transform(logits, self.config.logit_scale, self.config.logit_softcap)
        transformed = transformed.to(self.device)  # a target may hand logits back on the host
        lattice = self._op("selector_lattice")
        if lattice is None:
            return select_tokens(self.weights.selector, rows, transformed, int(last_token))
        sel = self.weights.selector
        compact = lattice(transformed.to(torch.float32).contiguous(), rows.contiguous(), sel.hidden,
                          sel.predecessor, sel.successor, int(last_token), sel.top_k)
        return walk_lattice(*(t.cpu() for t in compact))  # the compact readback

    def _argmax_rows(self, rows: torch.Tensor) -> tuple[list[int], list[float]]:
        """Each final-normed row's argmax token (a target id) and its softmax probability."""
        logits = self._scores(rows)  # [n, vocab] or [n, K] over the draft vocabulary
        transformed = logit_transform(logits, self.config.logit_scale, self.config.logit_softcap)
        top, tokens = transformed.max(dim=-1)  # [n] each
        conf = torch.exp(top - torch.logsumexp(transformed, dim=-1))  # softmax at the argmax
        if self._draft_ids is not None:
            tokens = self._draft_ids[tokens]  # draft rows -> target ids
        return [int(t) for t in tokens], [float(c) for c in conf]

    def draft_step(self, token: int, h_prev: "torch.Tensor", pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A one-token use of the block: (logits [vocab] for pos+1, drafter row 1 [H])."""
        if h_prev is not None and pos >= 1:
            self._inject(pos - 1, h_prev.reshape(1, -1))
        hidden = self.block_hidden(token, pos)
        return self._vocab_logits(hidden[1:2])[0], hidden[1]

    # -- passes ----------------------------------------------------------------------------
    def block_logits(self, last_token: int, position: int) -> torch.Tensor:
        """Raw logits [B-1, vocab] for the drafted rows (oracle tests): the target LM head's, or
        the draft vocabulary's with -inf elsewhere."""
        return self._vocab_logits(self.block_hidden(last_token, position)[1:])

    def _forget_from(self, position: int) -> None:
        for store in self._stores:
            store.forget_from(position)
        if self._last_row is not None and self._last_row[0] >= position:
            self._last_row = None

    def _inject(self, first: int, features: torch.Tensor) -> None:
        """Passes A and B for rows at positions ``first ..`` (rows before position 0 dropped)."""
        if features.shape[-1] != self.config.feature_size:
            raise ValueError(
                f"feature rows are {features.shape[-1]} wide, the drafter reads "
                f"{self.config.feature_size} ({len(self.config.target_layers)} taps x "
                f"{self.config.target_hidden_size}); are the target's feature taps set?"
            )
        if first < self._seen_end - 1:  # a rewind: everything from here on is another sequence
            self._forget_from(max(first, 0))
        end = first + features.shape[0]
        if first < 0:
            features, first = features[-first:], 0
        if features.shape[0] and not torch.any(features[0]):
            # an all-zero row stands for a row the loop does not have (position 0's predecessor,
            # the last row of a reused prefix): an absent key, not a key computed from zeros
            features, first = features[1:], first + 1
        if self._last_row is not None and features.shape[0] and self._last_row[0] == first:
            if torch.equal(self._last_row[1], features[0]):  # the carry row, already injected
                features, first = features[1:], first + 1
        if features.shape[0] == 0:
            self._seen_end = max(end, 0)
            return
        positions = torch.arange(first, first + features.shape[0], dtype=torch.long, device=self.device)  # [n]
        self.inject_rows(positions, features)
        self._last_row = (int(positions[-1]), features[-1].clone())  # on the caller's device
        self._seen_end = end

    def inject_rows(self, positions: torch.Tensor, features: torch.Tensor) -> None:
        """Pass A (encoder) and pass B (K/V into each layer's ring) for feature rows [n, F]."""
        cfg, w = self.config, self.weights
        features = features.to(self.device, self.dtype)
        inject = self.ops.get("dflash_inject")
        if inject is not None and self._inject_fits(features.shape[0]):
            self.kernels_used.add("dflash_inject")
            layers = [(lw.wk, lw.bk, lw.wv, lw.bv, lw.k_norm) for lw in w.layers]
            rings = [store.device_view(positions) for store in self._stores]
            inject(features.contiguous(), w.fc, w.enc_norm, layers, rings, positions, eps=cfg.eps,
                   rope_base=cfg.rope_base)
            return
        if self.native is not None and features.shape[0] <= self.block_size:
            # a commit (at most a block's rows) on the kernels; a longer catch-up (the prompt's
            # last rows, a park's) in torch below, whose float32 gemm is made for many rows
            self.kernels_used.add(NATIVE_OP)
            context = self.native.encode(features)  # [n, H]
            for layer, store in enumerate(self._stores):
                store.write(positions, *self.native.context_kv(layer, context, positions))
            return
        context = rms_norm(F.linear(features, w.fc), w.enc_norm, cfg.eps)  # [n, H]
        n = context.shape[0]
        for lw, store in zip(w.layers, self._stores):
            k = F.linear(context, lw.wk, lw.bk).view(n, cfg.n_head_kv, cfg.head_dim)
            k = rope_neox(rms_norm(k, lw.k_norm, cfg.eps), positions, cfg.rope_base)
            v = F.linear(context, lw.wv, lw.bv).view(n, cfg.n_head_kv, cfg.value_dim)
            store.write(positions, k, v)

    def _inject_fits(self, rows: int) -> bool:
        """The fused inject takes up to 32 rows per launch and a ring at least that long."""
        return rows <= INJECT_MAX_ROWS and all(not s.ring or s.capacity >= rows for s in self._stores)

    def block_hidden(self, anchor: int, position: int) -> torch.Tensor:
        """Pass C up to the final norm: the drafter rows [B, H] of ``[anchor, MASK x (B-1)]``."""
        if self.native is not None:
            return self.native.finish(self._native_block(anchor, position), 0, self.block_size)
        cfg = self.config
        x, positions = self._block_input(anchor, position)
        for layer, (lw, store) in enumerate(zip(self.weights.layers, self._stores)):
            window = cfg.sliding_window if cfg.layer_is_sliding(layer) else None
            x = self._layer(x, lw, store, positions, window)
        return rms_norm(x, self.weights.out_norm, cfg.eps)

    def _block_input(self, anchor: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's input rows [B, H] (embedded ``[anchor, MASK x (B-1)]``) and positions [B]."""
        self.counts.add(self.block_size)
        ids = torch.full((self.block_size,), self.config.mask_token_id, dtype=torch.long)
        ids[0] = int(anchor)
        positions = torch.arange(position, position + self.block_size, dtype=torch.long, device=self.device)  # [B]
        return self._embed(ids), positions

    def _native_block(self, anchor: int, position: int):
        """The native pass up to the last layer's keys and values (``NativeBlockPass.prepare``):
        its ``finish`` then computes only the output rows asked for."""
        cfg = self.config
        self.kernels_used.add(NATIVE_OP)
        x, positions = self._block_input(anchor, position)
        attends = [
            partial(self._attend_torch, store=store, key_positions=positions,
                    window=cfg.sliding_window if cfg.layer_is_sliding(layer) else None)
            for layer, store in enumerate(self._stores)
        ]
        return self.native.prepare(x, positions, attends)

    def _layer(
        self, x: torch.Tensor, lw: LayerWeights, store: ContextKV, positions: torch.Tensor, window: int | None
    ) -> torch.Tensor:
        cfg = self.config
        rows = x.shape[0]
        h = rms_norm(x, lw.attn_norm, cfg.eps)  # [B, H]
        h, out_taps = self._conv_in(h, lw.attn_conv)
        q = F.linear(h, lw.wq, lw.bq).view(rows, cfg.n_head, cfg.head_dim)
        q = rope_neox(rms_norm(q, lw.q_norm, cfg.eps), positions, cfg.rope_base)
        k = F.linear(h, lw.wk, lw.bk).view(rows, cfg.n_head_kv, cfg.head_dim)
        k = rope_neox(rms_norm(k, lw.k_norm, cfg.eps), positions, cfg.rope_base)
        v = F.linear(h, lw.wv, lw.bv).view(rows, cfg.n_head_kv, cfg.value_dim)
        attn = self._attend(q, k, v, store, positions, window)  # [B, nh*vd]
        out = F.linear(attn, lw.wo, lw.bo)  # [B, H]
        return self._ffn(self._conv_out(out, lw.attn_conv, out_taps, residual=x), lw)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, store: ContextKV, positions: torch.Tensor,
                window: int | None) -> torch.Tensor:
        """The block rows' attention [B, nh*vd] over the context store and the block itself
        (q [B, nh, hd], k [B, nkv, hd], v [B, nkv, vd]): non-causal inside the block."""
        start = int(positions[0])
        attention = self._op("dflash_block_attention")
        if attention is not None:  # one pass over the store: no gather, no mask tensor
            return attention(q.contiguous(), store.keys, store.values, store.positions, k.contiguous(),
                             v.contiguous(), start=start, window=window, scale=self._scale)
        return self._attend_torch(q, k, v, positions, store=store, key_positions=positions, window=window)

    def _attend_torch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_positions: torch.Tensor, *,
                      store: ContextKV, key_positions: torch.Tensor, window: int | None) -> torch.Tensor:
        """Attention [rows, nh*vd] of query rows q [rows, nh, hd] at ``query_positions`` (some
        or all of the block's) over the context store and the block's keys k [B, nkv, hd] and
        values v [B, nkv, vd] at ``key_positions`` [B]; non-causal inside the block."""
        start = int(key_positions[0])
        lo = start - window if window is not None else 0
        ctx_k, ctx_v, ctx_pos = store.gather(lo, start)  # [m, nkv, hd], [m, nkv, vd], [m]
        keys = torch.cat([ctx_k, k])  # [m+B, nkv, hd]
        values = torch.cat([ctx_v, v])
        key_pos = torch.cat([ctx_pos, key_positions])  # [m+B]
        if window is None:
            visible = torch.ones((q.shape[0], keys.shape[0]), dtype=torch.bool, device=keys.device)
        else:  # HF's bidirectional sliding window: |q - k| <= window (inclusive)
            visible = (query_positions[:, None] - key_pos[None, :]).abs() <= window  # [rows, m+B]
        return block_attention(q, keys, values, visible, self._scale)  # [rows, nh*vd]

    def _ffn(self, x: torch.Tensor, lw: LayerWeights) -> torch.Tensor:
        """The layer's second half: x + (conv'd) SwiGLU((conv'd) RMSNorm(x))."""
        h = rms_norm(x, lw.ffn_norm, self.config.eps)
        h, out_taps = self._conv_in(h, lw.ffn_conv)
        out = swiglu(h, lw.w_gate, lw.w_up, lw.w_down)
        return self._conv_out(out, lw.ffn_conv, out_taps, residual=x)

    def _conv_in(
        self, h: torch.Tensor, conv: ConvWeights | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """DFlash2: filter a sublayer's input; returns it and the taps for the output side."""
        if conv is None or not self.use_conv:
            return h, None
        kernel, groups = int(self.config.conv_kernel_size), self.config.conv_groups
        coef = F.linear(h, conv.proj).view(h.shape[0], 2, kernel, groups)  # [B, side, K, G]
        fused = self._op("dflash_grouped_conv")
        if fused is not None:
            return fused(h.contiguous(), coef[:, 0], conv.base[0], int(self.config.conv_group_size)), coef[:, 1]
        filtered = grouped_dynamic_conv(h, coef[:, 0], conv.base[0], int(self.config.conv_group_size))
        return filtered, coef[:, 1]

    def _conv_out(self, out: torch.Tensor, conv: ConvWeights | None, taps: torch.Tensor | None,
                  *, residual: torch.Tensor) -> torch.Tensor:
        """``residual + conv(out)`` (the residual add fused into the kernel when it runs)."""
        if conv is None or taps is None:
            return residual + out
        fused = self._op("dflash_grouped_conv")
        if fused is not None:
            return fused(out.contiguous(), taps, conv.base[1], int(self.config.conv_group_size), residual.contiguous())
        return residual + grouped_dynamic_conv(out, taps, conv.base[1], int(self.config.conv_group_size))

    # -- borrowed from the target ----------------------------------------------------------
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        emb = self.target.embed(ids.tolist())  # [B, H] the target's raw embedding rows
        self._target_dtype = emb.dtype
        return emb.to(self.device, self.dtype)

    def _lm_head(self, rows: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(rows.to(self._target_dtype or rows.dtype))

    def _scores(self, rows: torch.Tensor) -> torch.Tensor:
        """[n, K] over the draft vocabulary when the file has one, else the target's [n, vocab]."""
        if self.weights.draft_head is None:
            return self._lm_head(rows)
        if self.native is not None:
            return self.native.scores(rows)
        return F.linear(rows.to(self.dtype), self.weights.draft_head)

    def _vocab_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """[n, vocab]: the scores scattered over the target vocabulary (-inf outside the draft one)."""
        scores = self._scores(rows)
        if self._draft_ids is None:
            return scores
        full = scores.new_full((scores.shape[0], int(self.target.config.vocab_size)), float("-inf"))
        full[:, self._draft_ids] = scores
        return full
