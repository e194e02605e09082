"""``MuseGlimmerTarget``: the Muse-Glimmer text trunk as a ``tsspec`` SpeculativeTarget.

One layer (sandwich norms; GGUF norms are plain ``x_hat * w``, the converter folded HF's +1)::

    h = RMSNorm(x)                                   # attn_norm, eps
    q, k = RMSNorm_head(W_q h) * q_norm, RMSNorm_head(W_k h) * k_norm   # scaleless QK-norm
    q, k = rope(q), rope(k)                          # sliding layers only; global layers NoPE
    a = SDPA(q, k, W_v h) * sigmoid(W_gate h)        # sliding layers see the last `window` keys
    x = x + RMSNorm(W_o a)                           # post_attention_norm, post eps (1e-8)
    x = x + RMSNorm(W_down silu(W_gate' g) * W_up g),  g = RMSNorm(x)   # ffn_norm / post_ffw_norm

Input: a weightless RMSNorm of the token embedding. Output: final RMSNorm, ``z = W_out h``,
``logits = tanh(z * logit_scale / cap) * cap``. ``attn_q_norm`` carries ``qk_scale_factor``
(and here also 1/sqrt(hd), folded at load).

Two paths run a layer. On the CPU in float32 (the default) ``_kernel_layer`` uses the compiled
kernels (block matmuls on the file's quantised weights, RMSNorm, RoPE, attention, SiLU product)
and runs the two transcendental element-wise ops (the sigmoid gate and the softcap) one row at a
time, so every row is computed the same way whatever the row count: a k-row verify reproduces
the 1-row decode bit for bit. Elsewhere (float64 reference mode, a build without the kernels,
``--device cuda``) ``_torch_layer`` uses torch ops on the target's device; logits and hidden
rows come back on the host.

KV cache: every layer keeps every position ([layers, n_kv, capacity, hd]); a sliding layer's
query at position p reads keys ``max(0, p - window + 1) .. p``. Because nothing is evicted, a
verify whose rows straddle the window edge and any rewind (``spec_rewind_cache``,
``spec_keep``) are exact by construction: the window is a mask, not a ring. The cost is memory
for positions a sliding layer no longer reads (see the README).

Drafter-facing surface (DFlash borrows these):

* ``embed(ids) -> [n, H]``: the RAW token embedding (no embedding norm; DFlash's noise rows).
* ``final_norm(h) -> [n, H]``, ``lm_head(h) -> [n, vocab]``: the final norm and the output
  projection WITHOUT the logit scale and softcap (what DFlash drafts from);
  ``logit_transform(z)`` applies them.
* ``spec_set_feature_taps(layers)``: hidden rows become the residuals entering those layers,
  concatenated (tap 0 is the normed embedding; ``n_layers`` the last residual).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from tsspec.errors import GenerationError
from tsspec_gguf import native
from tsspec_gguf.qlinear import BlockMatrix
from tsspec.protocols import ModelConfig, resolve_feature_taps

from .hparams import ARCH, MuseGlimmerHParams
from .rope import RotaryTable

INITIAL_CAPACITY = 256  # KV slots allocated on first use; grown by doubling
FLOAT_BYTES = 4


def _linear(h: torch.Tensor, weight) -> torch.Tensor:
    """h [rows, in] @ weight^T for a dense weight or a BlockMatrix."""
    return weight.linear(h) if isinstance(weight, BlockMatrix) else F.linear(h, weight)


def _rowwise(fn, x: torch.Tensor) -> torch.Tensor:
    """fn applied to each row of x [rows, n] separately: a vectorised element-wise op then treats
    row r exactly as in a one-row call, whatever lane its first element falls in."""
    if x.shape[0] == 1:
        return fn(x)
    return torch.stack([fn(row) for row in x.unbind(0)])


class _Layer:
    __slots__ = ("attn_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm", "q_norm", "k_norm",
                 "wqkvg", "wo", "w_gate_up", "w_down", "sliding")

    def __init__(self, weights, i: int, sliding: bool):
        for name in self.__slots__[:-1]:
            setattr(self, name, weights[f"l{i}.{name}"])
        self.sliding = sliding


class MuseGlimmerTarget:
    """See the module docstring. Build it with ``tsspec_model_muse_glimmer.load_muse_glimmer``."""

    speculation_profitable = True  # the trunk verifies on its own: weight-free drafters serve it
    speculation_refusal: str | None = None
    spec_preferred_draft_window: int | None = None
    spec_verify_persists_accepted_kv = True

    def __init__(self, hparams: MuseGlimmerHParams, weights, *, tokenizer=None,
                 dtype: torch.dtype = torch.float32, path: str | None = None, device: str | torch.device = "cpu"):
        self.hparams = hp = hparams
        self.path = path
        self.dtype = dtype
        self.device = torch.device(device)
        if self.device.type != "cpu":  # dense weights only (quantised blocks are a CPU format)
            weights = {name: t.to(self.device) if isinstance(t, torch.Tensor) else t for name, t in weights.items()}
        self.tokenizer = tokenizer
        self.draft_head = None
        self.block_weights = any(isinstance(t, BlockMatrix) for t in weights.values())
        self._res_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self._kernels = native.kernels() if dtype == torch.float32 and self.device.type == "cpu" else None
        self.config = ModelConfig(
            architecture=ARCH,
            vocab_size=hp.vocab_size,
            hidden_size=hp.hidden_size,
            num_layers=hp.n_layers,
            context_length=hp.context_length,
            extra={**hp.as_extra(), "dtype": str(dtype).removeprefix("torch."),
                   "weights": "blocks" if self.block_weights else "dense"},
        )
        self._embed = weights["embed"]
        self._lm_head = weights["lm_head"]
        self._output_norm = weights["output_norm"]
        self._ones = torch.ones(hp.hidden_size, dtype=self._res_dtype, device=self.device)  # the weightless norms
        self._layers = [_Layer(weights, i, hp.sliding[i]) for i in range(hp.n_layers)]
        self._rope = RotaryTable(hp.head_dim, hp.rope_base_swa, self._res_dtype)
        self._seq_len = 0
        self._last_start = 0  # where the last spec_forward began (spec_keep counts from it)
        self._capacity = 0
        self._k: torch.Tensor | None = None  # [layers, n_kv, capacity, hd]
        self._v: torch.Tensor | None = None
        self._taps: tuple[int, ...] | None = None

    # -- sizes, taps ---------------------------------------------------------------------------
    @property
    def cache_seq_len(self) -> int:
        return self._seq_len

    @property
    def max_context_length(self) -> int:
        return self.hparams.context_length

    @property
    def spec_feature_size(self) -> int:
        return (len(self._taps) if self._taps else 1) * self.hparams.hidden_size

    @property
    def feature_taps(self) -> tuple[int, ...] | None:
        return self._taps

    def spec_set_feature_taps(self, layers: Sequence[int] | None) -> None:
        self._taps = resolve_feature_taps(layers, self.hparams.n_layers)

    # -- KV cache and rollback -----------------------------------------------------------------
    def spec_ensure_capacity(self, required_seq_len: int) -> None:
        if required_seq_len > self.max_context_length:
            raise GenerationError(f"{required_seq_len} tokens exceed the model's context of {self.max_context_length}")
        if required_seq_len <= self._capacity:
            return
        hp = self.hparams
        capacity = min(self.max_context_length, max(required_seq_len, 2 * self._capacity, INITIAL_CAPACITY))
        shape = (hp.n_layers, hp.n_kv_heads, capacity, hp.head_dim)
        k = torch.zeros(shape, dtype=self._res_dtype, device=self.device)
        v = torch.zeros(shape, dtype=self._res_dtype, device=self.device)
        if self._k is not None and self._seq_len:
            k[:, :, : self._seq_len] = self._k[:, :, : self._seq_len]
            v[:, :, : self._seq_len] = self._v[:, :, : self._seq_len]
        self._k, self._v, self._capacity = k, v, capacity

    def spec_rewind_cache(self, length: int) -> None:
        if not 0 <= length <= self._seq_len:
            raise ValueError(f"cannot rewind a cache of {self._seq_len} tokens to {length}")
        self._seq_len = length
        self._last_start = min(self._last_start, length)

    def spec_keep(self, rows_kept: int) -> None:
        """Keep the state after the first ``rows_kept`` rows of the last forward: no recurrent
        state and every key kept (the window is a mask), so this only sets the length."""
        rows = self._seq_len - self._last_start
        if not 1 <= rows_kept <= rows:
            raise ValueError(f"cannot keep {rows_kept} rows of a forward of {rows}")
        self._seq_len = self._last_start + int(rows_kept)

    def reset(self) -> None:
        self.spec_rewind_cache(0)

    # -- one layer ---------------------------------------------------------------------------------
    def _window_start(self, layer: _Layer, position: int) -> int:
        """The first key a query at ``position`` reads in ``layer``."""
        return max(0, position - self.hparams.sliding_window + 1) if layer.sliding else 0

    def _kernel_attention(self, i: int, q: torch.Tensor, past: int) -> torch.Tensor:
        """q [rows, nh * hd] (scaled) over layer i's cache -> [rows, nh * hd]. Rows whose window
        starts at key 0 go in one call; each later row is its own call with the cache pointers
        moved to its first key, the same call a one-row decode at that position makes."""
        hp, k, layer = self.hparams, self._kernels, self._layers[i]
        rows, hd = q.shape[0], hp.head_dim
        out = torch.empty((rows, hp.q_size), dtype=torch.float32)
        kc, vc = self._k[i], self._v[i]  # [nkv, capacity, hd]
        threads = torch.get_num_threads()
        whole = rows if not layer.sliding else max(0, min(rows, hp.sliding_window - past))
        if whole:
            k.attention(q.data_ptr(), q.stride(0), kc.data_ptr(), vc.data_ptr(), self._capacity, out.data_ptr(),
                        whole, hp.n_heads, hp.n_kv_heads, hd, past, threads)
        for t in range(whole, rows):
            position = past + t
            first = self._window_start(layer, position)
            shift = first * hd * FLOAT_BYTES
            k.attention(q[t].data_ptr(), q.stride(0), kc.data_ptr() + shift, vc.data_ptr() + shift, self._capacity,
                        out[t].data_ptr(), 1, hp.n_heads, hp.n_kv_heads, hd, position - first, threads)
        return out

    def _kernel_layer(self, i: int, x: torch.Tensor, past: int) -> torch.Tensor:
        """One layer on the compiled kernels (CPU float32); appends the rows' K/V."""
        hp, layer, k = self.hparams, self._layers[i], self._kernels
        rows, H, hd = x.shape[0], hp.hidden_size, hp.head_dim
        nq, nkv = hp.q_size, hp.kv_size
        h = torch.empty_like(x)
        k.rms_norm(x.data_ptr(), layer.attn_norm.data_ptr(), h.data_ptr(), rows, H, hp.rms_eps)
        y = _linear(h, layer.wqkvg)  # [rows, 2 nq + 2 nkv]: q | k | v | gate
        q_raw, k_raw = y[:, :nq].contiguous(), y[:, nq : nq + nkv].contiguous()
        q = torch.empty_like(q_raw)  # [rows, nq]
        kn = torch.empty_like(k_raw)  # [rows, nkv]
        k.rms_norm(q_raw.data_ptr(), layer.q_norm.data_ptr(), q.data_ptr(), rows * hp.n_heads, hd, hp.rms_eps)
        k.rms_norm(k_raw.data_ptr(), layer.k_norm.data_ptr(), kn.data_ptr(), rows * hp.n_kv_heads, hd, hp.rms_eps)
        if layer.sliding:
            table = self._rope.ensure(past + rows).data_ptr()
            k.rope(q.data_ptr(), q.stride(0), rows, hp.n_heads, hd, hd, table, past)
            k.rope(kn.data_ptr(), kn.stride(0), rows, hp.n_kv_heads, hd, hd, table, past)
        self._k[i][:, past : past + rows] = kn.view(rows, hp.n_kv_heads, hd).transpose(0, 1)
        self._v[i][:, past : past + rows] = y[:, nq + nkv : nq + 2 * nkv].reshape(rows, hp.n_kv_heads, hd).transpose(0, 1)
        attn = self._kernel_attention(i, q, past)  # [rows, nq]
        attn.mul_(_rowwise(torch.sigmoid, y[:, nq + 2 * nkv :]))
        o = _linear(attn, layer.wo)
        normed = torch.empty_like(o)
        k.rms_norm(o.data_ptr(), layer.post_attn_norm.data_ptr(), normed.data_ptr(), rows, H, hp.post_norm_eps)
        x = x + normed
        k.rms_norm(x.data_ptr(), layer.ffn_norm.data_ptr(), h.data_ptr(), rows, H, hp.rms_eps)
        gate_up = _linear(h, layer.w_gate_up)  # [rows, 2 F]
        act = torch.empty((rows, hp.ffn_size), dtype=torch.float32)
        k.silu_mul(gate_up.data_ptr(), act.data_ptr(), rows, hp.ffn_size)
        d = _linear(act, layer.w_down)
        k.rms_norm(d.data_ptr(), layer.post_ffn_norm.data_ptr(), normed.data_ptr(), rows, H, hp.post_norm_eps)
        return x + normed

    def _torch_layer(self, i: int, x: torch.Tensor, past: int) -> torch.Tensor:
        """One layer with torch ops (float64 reference mode, no compiled kernels)."""
        hp, layer = self.hparams, self._layers[i]
        rows, end, hd = x.shape[0], past + x.shape[0], hp.head_dim
        nq, nkv = hp.q_size, hp.kv_size
        h = F.rms_norm(x, (hp.hidden_size,), layer.attn_norm, hp.rms_eps)
        y = _linear(h.to(self.dtype), layer.wqkvg).to(self._res_dtype)
        q = F.rms_norm(y[:, :nq].reshape(rows, hp.n_heads, hd), (hd,), layer.q_norm, hp.rms_eps)
        kn = F.rms_norm(y[:, nq : nq + nkv].reshape(rows, hp.n_kv_heads, hd), (hd,), layer.k_norm, hp.rms_eps)
        if layer.sliding:
            q, kn = self._rope.apply(q, past), self._rope.apply(kn, past)
        self._k[i][:, past:end] = kn.transpose(0, 1)
        self._v[i][:, past:end] = y[:, nq + nkv : nq + 2 * nkv].reshape(rows, hp.n_kv_heads, hd).transpose(0, 1)
        keys = torch.arange(end, device=x.device)
        positions = past + torch.arange(rows, device=x.device)
        first = positions - hp.sliding_window + 1 if layer.sliding else torch.zeros_like(positions)
        visible = (keys[None, :] <= positions[:, None]) & (keys[None, :] >= first[:, None])  # [rows, end]
        kc = self._k[i][:, :end].repeat_interleave(hp.group_size, dim=0)  # [nh, end, hd]
        vc = self._v[i][:, :end].repeat_interleave(hp.group_size, dim=0)
        scores = torch.matmul(q.transpose(0, 1), kc.transpose(1, 2))  # [nh, rows, end]
        scores = scores.masked_fill(~visible, float("-inf"))
        attn = torch.matmul(torch.softmax(scores, dim=-1), vc).transpose(0, 1).reshape(rows, nq)
        attn = attn * torch.sigmoid(y[:, nq + 2 * nkv :])
        o = _linear(attn.to(self.dtype), layer.wo).to(self._res_dtype)
        x = x + F.rms_norm(o, (hp.hidden_size,), layer.post_attn_norm, hp.post_norm_eps)
        g = F.rms_norm(x, (hp.hidden_size,), layer.ffn_norm, hp.rms_eps)
        gate_up = _linear(g.to(self.dtype), layer.w_gate_up).to(self._res_dtype)
        act = F.silu(gate_up[:, : hp.ffn_size]) * gate_up[:, hp.ffn_size :]
        d = _linear(act.to(self.dtype), layer.w_down).to(self._res_dtype)
        return x + F.rms_norm(d, (hp.hidden_size,), layer.post_ffn_norm, hp.post_norm_eps)

    # -- forward -----------------------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self._kernels is None:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        x = x.contiguous()
        out = torch.empty_like(x)
        self._kernels.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
        return out

    @torch.inference_mode()
    def forward_residual(self, tokens: Sequence[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run the layers over ``tokens`` at positions cache_seq_len.. and append their K/V.
        Returns (final residual [rows, H] before the final norm, tapped residuals)."""
        rows = len(tokens)
        if rows == 0:
            raise ValueError("spec_forward needs at least one token")
        ids = [int(t) for t in tokens]
        if min(ids) < 0 or max(ids) >= self.hparams.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.hparams.vocab_size})")
        past = self._seq_len
        self.spec_ensure_capacity(past + rows)
        x = self._rms(self.embed(ids).to(self._res_dtype), self._ones, self.hparams.rms_eps)  # [rows, H]
        taps = self._taps or ()
        tapped: dict[int, torch.Tensor] = {}
        layer_fn = self._kernel_layer if self._kernels is not None else self._torch_layer
        for i in range(self.hparams.n_layers):
            if i in taps:
                tapped[i] = x
            x = layer_fn(i, x, past)
        tapped[self.hparams.n_layers] = x
        self._last_start, self._seq_len = past, past + rows
        return x, [tapped[t] for t in taps]

    def logit_transform(self, z: torch.Tensor) -> torch.Tensor:
        """``tanh(z * logit_scale / cap) * cap`` (``z * logit_scale`` without a softcap), per row."""
        hp = self.hparams

        def transform(row: torch.Tensor) -> torch.Tensor:
            row = row * hp.logit_scale
            return torch.tanh(row / hp.softcap) * hp.softcap if hp.softcap else row

        return _rowwise(transform, z)

    @torch.inference_mode()
    def spec_forward(
        self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [rows or 1, vocab]; hidden [rows, spec_feature_size] or None."""
        x, tapped = self.forward_residual(tokens)
        normed = self._rms(x if all_logits_rows else x[-1:], self._output_norm, self.hparams.rms_eps)
        logits = self.logit_transform(self._raw_logits(normed))
        hidden = None
        if want_hidden:
            if self._taps is not None:
                hidden = torch.cat(tapped, dim=-1)
            else:
                hidden = normed if all_logits_rows else self._rms(x, self._output_norm, self.hparams.rms_eps)
        if self.device.type != "cpu":  # the loop samples on the host
            logits = logits.cpu()
            hidden = hidden.cpu() if hidden is not None else None
        return logits, hidden

    def _raw_logits(self, normed: torch.Tensor) -> torch.Tensor:
        return _linear(normed.to(self.dtype), self._lm_head).to(self._res_dtype)

    # -- drafter-facing surface --------------------------------------------------------------------
    @torch.inference_mode()
    def embed(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Raw token embeddings [n, H] (no embedding norm)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device).reshape(-1)
        table = self._embed
        rows = table.rows(ids) if isinstance(table, BlockMatrix) else F.embedding(ids, table)
        return rows.to(self._res_dtype)

    @torch.inference_mode()
    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._rms(hidden.to(self.device, self._res_dtype), self._output_norm, self.hparams.rms_eps)

    @torch.inference_mode()
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """``W_out h`` [n, vocab] of already-normed rows, without the logit scale and softcap."""
        return self._raw_logits(hidden.to(self.device, self._res_dtype))

    def __repr__(self) -> str:
        hp = self.hparams
        return (f"MuseGlimmerTarget(layers={hp.n_layers} ({sum(hp.sliding)} sliding), hidden={hp.hidden_size}, "
                f"heads={hp.n_heads}/{hp.n_kv_heads}, window={hp.sliding_window}, vocab={hp.vocab_size}, {self.dtype})")
