"""The hybrid trunk: embedding -> [GDN or gated attention, then FFN] x L -> final norm -> LM head.

Block: ``x += mixer(RMSNorm(x)); x += FFN(RMSNorm_post(x))``. ``Qwen35Trunk.forward`` runs rows
at positions ``start ..`` in one of two modes:

* ``commit`` (prefill, plain steps, re-forwards): every layer's state advances in place.
* ``slots`` (verify): attention layers write their K/V at the rows' positions (positions past
  the committed length are scratch until a commit), GDN layers only READ their live state and
  emit the state after every row (``DeltaNetSlots``). ``TrunkState.commit_slots(slots, m)`` then
  makes the state after row m live: no recompute (one launch for every layer on the kernels).

Device: the trunk runs where its weights are (CPU or CUDA). ``kernels`` ({op: callable}, the
registered ops for that device) swaps in the fused GDN ops (``gdn_verify``, ``gdn_step``,
``gdn_commit``) where present; without them the same code runs the torch ops.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import torch

from .attention import AttentionWeights, KVCache, gated_attention
from .deltanet import DeltaNetLayer, DeltaNetSlots, DeltaNetState
from .hparams import Qwen35HParams
from .ops import PartialRope, exact_rows, linear, rms_norm
from .weights import LayerWeights, Qwen35Weights


def state_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """The recurrent state is kept in float32 at least (float64 for a float64 model)."""
    return torch.promote_types(dtype, torch.float32)


@attrs.define
class TrunkState:
    """One sequence's cache: a KV cache per attention layer, a DeltaNetState per GDN layer."""

    per_layer: list[KVCache | DeltaNetState]

    def recurrent(self) -> list[tuple[int, DeltaNetState]]:
        return [(i, s) for i, s in enumerate(self.per_layer) if isinstance(s, DeltaNetState)]

    def commit_slots(self, slots: dict[int, DeltaNetSlots], row: int) -> None:
        """Make slot ``row`` of a verify live in every GDN layer: one batched ``gdn_commit``
        when the slots came from the kernel, else each layer's own commit."""
        ops = {s.commit_op for s in slots.values()}
        if len(ops) == 1 and None not in ops:
            layers = sorted(slots)
            live = [self.per_layer[i] for i in layers]
            ops.pop()([slots[i].block for i in layers], [slots[i].window for i in layers],
                      [s.ssm for s in live], [s.conv for s in live], row)
            for s in slots.values():
                s.used.add("gdn_commit")
            return
        for index, layer_slots in slots.items():
            layer_slots.commit_into(self.per_layer[index], row)

    def snapshot(self) -> dict[int, DeltaNetState]:
        return {i: s.clone() for i, s in self.recurrent()}

    def restore(self, saved: dict[int, DeltaNetState]) -> None:
        for i, s in self.recurrent():
            s.copy_from(saved[i])

    def zero_recurrent(self) -> None:
        for _, s in self.recurrent():
            s.zero_()

    def ensure(self, rows: int, limit: int) -> None:
        for s in self.per_layer:
            if isinstance(s, KVCache):
                s.ensure(rows, limit)


@attrs.define
class ForwardOut:
    residual: torch.Tensor  # [rows, H] the residual stream after the last layer (pre final norm)
    taps: torch.Tensor | None  # [rows, len(taps) * H] residuals entering the tapped layers
    slots: dict[int, DeltaNetSlots] | None  # per GDN layer, in slots mode


class Qwen35Trunk:
    """The torch trunk over loaded weights. Stateless: the sequence lives in a TrunkState."""

    def __init__(self, hp: Qwen35HParams, weights: Qwen35Weights, dtype: torch.dtype = torch.float32,
                 kernels: dict | None = None):
        self.hp = hp
        self.w = weights
        self.dtype = dtype
        self.device = weights.embed.device
        self.state_dtype = state_dtype_for(dtype)
        self.kernels_used: set[str] = set()  # registered ops that have run (for --stats)
        self.rope = PartialRope(hp.rope_dims, hp.rope_base, dtype)
        self.mixers: list[DeltaNetLayer | AttentionWeights] = []
        for lw in weights.layers:
            if isinstance(lw.mixer, AttentionWeights):
                self.mixers.append(lw.mixer)
            else:
                self.mixers.append(DeltaNetLayer(
                    lw.mixer, num_k=hp.num_k_heads, num_v=hp.num_v_heads, dk=hp.k_head_dim,
                    dv=hp.v_head_dim, kernel=hp.conv_kernel, eps=hp.rms_eps, state_dtype=self.state_dtype,
                    kernels=kernels, used=self.kernels_used,
                ))

    def new_state(self) -> TrunkState:
        hp = self.hp
        per_layer: list[KVCache | DeltaNetState] = []
        for mixer in self.mixers:
            if isinstance(mixer, DeltaNetLayer):
                per_layer.append(mixer.new_state(self.dtype))
            else:
                per_layer.append(KVCache(hp.num_kv_heads, hp.head_dim, self.dtype, self.device))
        return TrunkState(per_layer)

    # -- drafter-facing pieces -------------------------------------------------------------
    def embed(self, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        return self.w.embed[torch.as_tensor(ids, dtype=torch.long, device=self.device)]  # [n, H]

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return rms_norm(h, self.w.final_norm, self.hp.rms_eps)

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return linear(h, self.w.lm_head)  # [n, V]

    # -- the forward -----------------------------------------------------------------------
    def attention_block(self, lw: LayerWeights, x: torch.Tensor, cache: KVCache, start: int,
                        cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One full-attention decoder layer (also the MTP head's layer). x [rows, H]."""
        hp = self.hp
        h = rms_norm(x, lw.attn_norm, hp.rms_eps)
        x = x + gated_attention(lw.mixer, h, cache, start, self.rope, cos, sin, num_heads=hp.num_heads,
                                num_kv_heads=hp.num_kv_heads, head_dim=hp.head_dim, eps=hp.rms_eps)
        return x + lw.ffn(rms_norm(x, lw.post_norm, hp.rms_eps))

    def forward(self, tokens: Sequence[int], start: int, state: TrunkState, *, slots: bool,
                taps: Sequence[int] | None = None) -> ForwardOut:
        """Rows ``tokens`` at positions ``start ..``; see the module docstring for the modes."""
        hp = self.hp
        x = self.embed(list(tokens))  # [rows, H]
        rows = x.shape[0]
        cos, sin = self.rope.tables(torch.arange(start, start + rows, device=self.device),
                                    exact=exact_rows(self.w.lm_head))
        tapped: dict[int, torch.Tensor] = {}
        tap_set = set(taps or ())
        out_slots: dict[int, DeltaNetSlots] | None = {} if slots else None
        for i, (lw, mixer, layer_state) in enumerate(zip(self.w.layers, self.mixers, state.per_layer)):
            if i in tap_set:
                tapped[i] = x
            if isinstance(mixer, DeltaNetLayer):
                h = rms_norm(x, lw.attn_norm, hp.rms_eps)
                if slots:
                    mixed, out_slots[i] = mixer.forward_slots(h, layer_state)
                else:
                    mixed = mixer.forward_commit(h, layer_state)
                x = x + mixed
                x = x + lw.ffn(rms_norm(x, lw.post_norm, hp.rms_eps))
            else:
                x = self.attention_block(lw, x, layer_state, start, cos, sin)
        if hp.num_layers in tap_set:
            tapped[hp.num_layers] = x
        features = torch.cat([tapped[t] for t in taps], dim=-1) if taps else None
        return ForwardOut(residual=x, taps=features, slots=out_slots)
