"""``LlamaTarget``: a llama-family dense transformer as a ``tsspec`` SpeculativeTarget.

Block: ``x += W_o attn(rope(q), rope(k), v)`` on ``RMSNorm(x)``, then
``x += W_down (silu(W_gate h) * W_up h)`` on ``RMSNorm(x)``; final RMSNorm; LM head (the
embedding when the file has no ``output.weight``).

Attention is GQA without copying the cache per step: the KV cache is [n_kv, capacity, hd] per
layer and the queries of the ``group`` heads that share a KV head are stacked as extra query
rows of that KV head, ``q [n_kv, group * rows, hd]``, so one batched SDPA serves all heads.
A multi-row call (prefill, verify) masks causally with the cache offset: row t sees keys
``0 .. past + t``.

KV cache: pre-allocated and grown geometrically (``spec_ensure_capacity``); a rejected draft
tail is dropped by ``spec_rewind_cache`` (the slots are simply overwritten later), so the
target has no recurrent state and snapshot/restore are no-ops.

Drafter-facing surface (DFlash-style block drafters and per-token heads borrow these):

* ``embed(token_ids) -> [n, H]``: the raw token embedding.
* ``final_norm(h [n, H]) -> [n, H]``: the last RMSNorm.
* ``lm_head(h [n, H]) -> [n, vocab]``: the output projection; it does NOT apply the final norm.
* ``spec_set_feature_taps(layers)``: hidden rows become the residuals entering those layers,
  concatenated (``layers`` may include ``n_layers``: the residual after the last layer).

All three return float32 on the CPU, like ``spec_forward``'s logits and hidden rows.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from tsspec.errors import GenerationError
from tsspec.protocols import ModelConfig

from .hparams import LlamaHParams
from .rope import RotaryTable
from .weights import residual_dtype

INITIAL_CAPACITY = 256  # KV slots allocated on first use; grown by doubling
OUTPUT_DEVICE = torch.device("cpu")


class _Layer:
    """One block's prepared tensors (plain attributes: the hot loop reads them directly)."""

    __slots__ = ("attn_norm", "wqkv", "bqkv", "wo", "bo", "ffn_norm", "w_gate_up", "w_down")

    def __init__(self, weights: dict[str, torch.Tensor], i: int, device: torch.device):
        def get(name):
            t = weights.get(f"l{i}.{name}")
            return None if t is None else t.to(device)

        self.attn_norm = get("attn_norm")
        self.wqkv = get("wqkv")
        self.bqkv = get("bqkv")
        self.wo = get("wo")
        self.bo = get("bo")
        self.ffn_norm = get("ffn_norm")
        self.w_gate_up = get("w_gate_up")
        self.w_down = get("w_down")


class LlamaTarget:
    """See the module docstring. Build it with ``tsspec_model_llama.load_llama``."""

    speculation_profitable = True
    speculation_refusal: str | None = None
    spec_preferred_draft_window: int | None = None
    spec_verify_persists_accepted_kv = True

    def __init__(
        self,
        hparams: LlamaHParams,
        weights: dict[str, torch.Tensor],
        *,
        tokenizer=None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        path: str | None = None,
        load_seconds: float | None = None,
        cache_hit: bool | None = None,
    ):
        self.hparams = hp = hparams
        self.path = path
        self.device = torch.device(device)
        self.dtype = dtype
        self.tokenizer = tokenizer
        self.draft_head = None
        self.load_seconds = load_seconds
        self.cache_hit = cache_hit
        tied = "lm_head" not in weights
        self.config = ModelConfig(
            architecture=hp.architecture,
            vocab_size=hp.vocab_size,
            hidden_size=hp.hidden_size,
            num_layers=hp.n_layers,
            context_length=hp.context_length,
            extra={**hp.as_extra(), "tied_embeddings": tied, "dtype": str(dtype).removeprefix("torch.")},
        )
        self._embed = weights["embed"].to(self.device)
        self._lm_head = self._embed if tied else weights["lm_head"].to(self.device)
        self._output_norm = weights["output_norm"].to(self.device)
        self._layers = [_Layer(weights, i, self.device) for i in range(hp.n_layers)]
        self._rope = RotaryTable(
            hp.rope_dim,
            hp.rope_base,
            linear_factor=hp.rope_linear_factor,
            freq_factors=weights.get("rope_freqs"),
            device=self.device,
            dtype=residual_dtype(dtype) if dtype in (torch.float32, torch.float64) else dtype,
        )
        self._eps = hp.rms_eps
        self._residual_dtype = residual_dtype(dtype)
        self._qk_heads = hp.n_heads + hp.n_kv_heads
        self._qk_size = self._qk_heads * hp.head_dim
        self._seq_len = 0
        self._capacity = 0
        self._k: torch.Tensor | None = None  # [layers, n_kv, capacity, hd]
        self._v: torch.Tensor | None = None
        self._taps: tuple[int, ...] | None = None

    # -- SpeculativeTarget: sizes ------------------------------------------------------------
    @property
    def cache_seq_len(self) -> int:
        return self._seq_len

    @property
    def max_context_length(self) -> int:
        return self.hparams.context_length

    @property
    def spec_feature_size(self) -> int:
        taps = len(self._taps) if self._taps else 1
        return taps * self.hparams.hidden_size

    @property
    def feature_taps(self) -> tuple[int, ...] | None:
        return self._taps

    def spec_set_feature_taps(self, layers: Sequence[int] | None) -> None:
        if layers is None:
            self._taps = None
            return
        taps = tuple(int(layer) for layer in layers)
        if not taps or any(not 0 <= t <= self.hparams.n_layers for t in taps):
            raise ValueError(f"feature taps must be layer ids in 0..{self.hparams.n_layers}, got {list(layers)}")
        self._taps = taps

    # -- KV cache --------------------------------------------------------------------------
    def spec_ensure_capacity(self, required_seq_len: int) -> None:
        if required_seq_len > self.max_context_length:
            raise GenerationError(
                f"{required_seq_len} tokens exceed the model's context of {self.max_context_length}"
            )
        if required_seq_len <= self._capacity:
            return
        hp = self.hparams
        capacity = min(self.max_context_length, max(required_seq_len, 2 * self._capacity, INITIAL_CAPACITY))
        shape = (hp.n_layers, hp.n_kv_heads, capacity, hp.head_dim)
        k = torch.empty(shape, dtype=self.dtype, device=self.device)
        v = torch.empty(shape, dtype=self.dtype, device=self.device)
        if self._k is not None and self._seq_len:
            k[:, :, : self._seq_len] = self._k[:, :, : self._seq_len]
            v[:, :, : self._seq_len] = self._v[:, :, : self._seq_len]
        self._k, self._v, self._capacity = k, v, capacity
        self._rope.ensure(capacity)

    def spec_rewind_cache(self, length: int) -> None:
        if not 0 <= length <= self._seq_len:
            raise ValueError(f"cannot rewind a cache of {self._seq_len} tokens to {length}")
        self._seq_len = length

    def reset(self) -> None:
        self.spec_rewind_cache(0)

    # no recurrent state: a KV rewind is the whole rollback
    def spec_snapshot_recurrent_state(self) -> None:
        return None

    def spec_restore_recurrent_state(self) -> None:
        return None

    def spec_on_verify_accepted(self, accepted: int, rows: int) -> bool:
        return False

    # -- forward ---------------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, weight.shape, weight, self._eps)

    def _attention(self, i: int, h: torch.Tensor, past: int, cos, sin, mask) -> torch.Tensor:
        """h [rows, H] (normed) -> attention output projected, [rows, H]."""
        hp = self.hparams
        layer = self._layers[i]
        rows = h.shape[0]
        qkv = F.linear(h, layer.wqkv, layer.bqkv)  # [rows, (nh + 2 nkv) hd]
        qk = self._rope.apply(qkv[:, : self._qk_size].view(rows, self._qk_heads, hp.head_dim), cos, sin)
        end = past + rows
        k_cache, v_cache = self._k[i], self._v[i]  # [nkv, capacity, hd]
        k_cache[:, past:end] = qk[:, hp.n_heads :].transpose(0, 1)
        v_cache[:, past:end] = qkv[:, self._qk_size :].view(rows, hp.n_kv_heads, hp.head_dim).transpose(0, 1)
        keys, values = k_cache[:, :end], v_cache[:, :end]  # [nkv, end, hd]
        q = qk[:, : hp.n_heads]  # [rows, nh, hd]; head j uses KV head j // group
        if rows == 1:
            out = F.scaled_dot_product_attention(q.view(hp.n_kv_heads, hp.group_size, hp.head_dim), keys, values)
            out = out.reshape(1, hp.q_size)
        else:
            q = q.reshape(rows, hp.n_kv_heads, hp.group_size, hp.head_dim).permute(1, 2, 0, 3)
            q = q.reshape(hp.n_kv_heads, hp.group_size * rows, hp.head_dim)  # rows ordered (group, row)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            out = out.view(hp.n_kv_heads, hp.group_size, rows, hp.head_dim).permute(2, 0, 1, 3)
            out = out.reshape(rows, hp.q_size)
        return F.linear(out, layer.wo, layer.bo)

    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        layer = self._layers[i]
        gate_up = F.linear(h, layer.w_gate_up)  # [rows, 2 F]
        ffn = self.hparams.ffn_size
        return F.linear(F.silu(gate_up[:, :ffn]) * gate_up[:, ffn:], layer.w_down)

    def _causal_mask(self, past: int, rows: int) -> torch.Tensor | None:
        """[group * rows, past + rows] bool, True where a query row may attend."""
        if rows == 1:
            return None
        keys = torch.arange(past + rows, device=self.device)
        allowed = keys[None, :] <= (past + torch.arange(rows, device=self.device))[:, None]  # [rows, keys]
        return allowed.repeat(self.hparams.group_size, 1)

    @torch.inference_mode()
    def forward_residual(self, tokens: Sequence[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run the blocks over ``tokens`` at positions cache_seq_len.. and append them to the KV
        cache. Returns (final residual [rows, H] before the final norm, tapped residuals)."""
        rows = len(tokens)
        if rows == 0:
            raise ValueError("spec_forward needs at least one token")
        past = self._seq_len
        self.spec_ensure_capacity(past + rows)
        ids = torch.as_tensor(list(tokens), dtype=torch.long, device=self.device)
        if int(ids.min()) < 0 or int(ids.max()) >= self.hparams.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.hparams.vocab_size})")
        residual = self._residual_dtype
        x = F.embedding(ids, self._embed).to(residual)  # [rows, H] residual stream (float32)
        cos, sin = self._rope.tables(past, rows)
        mask = self._causal_mask(past, rows)
        taps = self._taps
        tapped: dict[int, torch.Tensor] = {}
        dtype = self.dtype
        for i in range(self.hparams.n_layers):
            if taps is not None and i in taps:
                tapped[i] = x
            layer = self._layers[i]
            x = x + self._attention(i, self._rms(x, layer.attn_norm).to(dtype), past, cos, sin, mask).to(residual)
            x = x + self._mlp(i, self._rms(x, layer.ffn_norm).to(dtype)).to(residual)
        tapped[self.hparams.n_layers] = x
        self._seq_len = past + rows
        return x, [tapped[t] for t in taps or ()]

    @torch.inference_mode()
    def spec_forward(
        self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [rows or 1, vocab] float32; hidden [rows, spec_feature_size] float32 or None."""
        x, tapped = self.forward_residual(tokens)
        normed = self._rms(x if all_logits_rows else x[-1:], self._output_norm)
        logits = F.linear(normed.to(self.dtype), self._lm_head).to(OUTPUT_DEVICE, torch.float32)
        hidden = None
        if want_hidden:
            if self._taps is not None:
                hidden = torch.cat(tapped, dim=-1)
            else:
                hidden = normed if all_logits_rows else self._rms(x, self._output_norm)
            hidden = hidden.to(OUTPUT_DEVICE, torch.float32)
        return logits, hidden

    # -- drafter-facing surface ------------------------------------------------------------
    @torch.inference_mode()
    def embed(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Raw token embeddings [n, H] (float32, CPU)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device).reshape(-1)
        return F.embedding(ids, self._embed).to(OUTPUT_DEVICE, torch.float32)

    @torch.inference_mode()
    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final RMSNorm of [n, H] rows (float32, CPU)."""
        normed = self._rms(hidden.to(self.device, self._residual_dtype), self._output_norm)
        return normed.to(OUTPUT_DEVICE, torch.float32)

    @torch.inference_mode()
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] of already-normed rows [n, H] (no final norm applied here)."""
        return F.linear(hidden.to(self.device, self.dtype), self._lm_head).to(OUTPUT_DEVICE, torch.float32)

    def __repr__(self) -> str:
        hp = self.hparams
        return (
            f"LlamaTarget({hp.architecture}, layers={hp.n_layers}, hidden={hp.hidden_size}, "
            f"heads={hp.n_heads}/{hp.n_kv_heads}, vocab={hp.vocab_size}, {self.device}, {self.dtype})"
        )
