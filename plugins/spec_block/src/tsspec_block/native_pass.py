"""NativeBlockPass: the DFlash drafter's matrices on the compiled CPU kernels, as int8 blocks.

A block pass of the shipped SmolLM2 drafter (8 rows, 1 layer, a 4,096-row draft head) ran its
matrices as float32 torch ops (~23 MB of weights; ~5 ms a pass, ``aten::mm`` 69% of it). Here
every matrix is an int8 block copy (format 8, one float32 scale per 32 weights:
``BlockMatrix.quantize_int8``, the copies the NextN native head uses) multiplied by the kernels'
``gemm`` with float32 rows: a quarter of the bytes, and one call per matrix instead of a chain
of torch ops. At 8 rows the kernels' gemm is bound by its arithmetic more than by the bytes
(every weight is used 8 times), so the larger saving is computing fewer rows (below):

    pass A  context = rms_norm(fc @ features)                       1 gemm + 1 norm call
    pass B  k, v    = (W_k; W_v) @ context                          1 gemm (k, v fused), per layer
    pass C  h = rms_norm(x); q = W_q @ h; k, v = (W_k; W_v) @ h     1 norm + 2 gemms
            x = x + W_o @ attention(q, k, v)                        1 gemm (residual as its base)
            x = x + W_down @ silu_mul((W_gate; W_up) @ rms_norm(x)) 1 norm + 2 gemms + 1 silu_mul
            logits = draft_head @ rms_norm(x[rows])                 1 norm + 1 gemm

In the LAST layer a row's output needs every row's keys and values but nothing else of the
other rows, so ``prepare`` runs the earlier layers on every row and the last layer's keys and
values, and ``finish(state, lo, hi)`` computes only rows lo..hi-1's queries, attention, output
projection and FFN: a 1-layer drafter whose caller wants row 1 first pays ~1/4 of the block's
matrix work for it, and the rest only when it asks for them.

The pieces with no matrix stay in torch on purpose: the per-head q/k norms and the NeoX RoPE
(from a float32 table whose angles were computed in float64, the reference's values), and the
attention over the context store + block (non-causal inside the block, a sliding window where
the file says so: the kernels' attention is causal, so it cannot serve). Those are a few small
ops on 8 rows; the matrices were ~90% of the pass.

The numbers differ from the torch reference (``head.py``) by the int8 rounding of the weights
and the kernels' summation order: drafts may differ, the output never does (verification
decides). ``tests/test_native_pass.py`` bounds the difference on the shipped drafter's real rows.

The pass holds weights only (and a RoPE table that grows, replaced whole): the per-sequence
views of a head share one. It serves DFlash files (no DFlash2 convolution) on a float32 CPU
drafter whose matrices are whole 32-weight blocks; ``supports`` says whether it can.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs
import torch

from .config import DFlashConfig
from .weights import DFlashWeights

__all__ = ["NativeBlockPass", "supports"]

QK = 32  # weights per int8 block
# the rows stay float32 against the int8 weights (the NextN native head's arithmetic): on the
# shipped drafter's real rows the logits then move by ~1.4% of their range against the torch
# pass, with int8 rows (llama.cpp's arithmetic) ~3.4%, for no clear gain in a pass's time
ROW_PRECISION = "float32"


def supports(config: DFlashConfig, weights: DFlashWeights, *, dtype: torch.dtype, device: torch.device,
             use_conv: bool) -> bool:
    """True when the compiled kernels are built and can run this drafter's matrices."""
    from tsspec_gguf import native

    k = native.kernels()
    if k is None or not all(hasattr(k, name) for name in ("gemm", "rms_norm", "silu_mul")):
        return False
    if device.type != "cpu" or dtype != torch.float32 or use_conv:
        return False
    inner = [weights.fc.shape[1], config.hidden_size, config.ffn_size, config.n_head * config.value_dim]
    return all(int(width) % QK == 0 for width in inner)


def _q8(weight: torch.Tensor):
    from tsspec_gguf.qlinear import BlockMatrix

    return BlockMatrix.quantize_int8(weight.detach().to(torch.float32))


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to(torch.float32).contiguous()


class _Layer:
    """One drafter layer's int8 matrices and float32 vectors."""

    def __init__(self, lw) -> None:
        from tsspec_gguf.qlinear import BlockMatrix

        self.q = _q8(lw.wq)  # [nh*hd, H]
        self.kv = BlockMatrix.concat([_q8(lw.wk), _q8(lw.wv)])  # [k + v, H]: pass B and the block's own
        self.wo = _q8(lw.wo)  # [H, nh*vd]
        self.gate_up = BlockMatrix.concat([_q8(lw.w_gate), _q8(lw.w_up)])  # [2F, H]
        self.down = _q8(lw.w_down)  # [H, F]
        self.attn_norm, self.ffn_norm = _f32(lw.attn_norm), _f32(lw.ffn_norm)
        self.q_norm, self.k_norm = _f32(lw.q_norm), _f32(lw.k_norm)
        self.bq = _f32(lw.bq)  # [nh*hd] or None
        self.bkv = None if lw.bk is None and lw.bv is None else torch.cat([  # [k + v]
            _f32(b) if b is not None else torch.zeros(int(w.shape[0])) for b, w in ((lw.bk, lw.wk), (lw.bv, lw.wv))])
        self.bo = _f32(lw.bo)


class NativeBlockPass:
    """The drafter's passes with its matrices on the kernels (see the module docstring)."""

    def __init__(self, config: DFlashConfig, weights: DFlashWeights) -> None:
        from tsspec_gguf import native

        self._k = native.kernels()
        self.config = config
        self.precision = ROW_PRECISION
        self.fc = _q8(weights.fc)  # [H, taps * H_target]
        self.enc_norm, self.out_norm = _f32(weights.enc_norm), _f32(weights.out_norm)
        self.layers = [_Layer(lw) for lw in weights.layers]
        self.draft_head = None if weights.draft_head is None else _q8(weights.draft_head)  # [K, H]
        self._rope = torch.zeros(0, config.head_dim)  # [positions, hd]: cos | sin halves, see rope
        self._lock = threading.Lock()

    # -- small pieces --------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm of the rows of a contiguous float32 [n, H] (the kernels' rms_norm)."""
        out = torch.empty_like(x)
        self._k.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1],
                         float(self.config.eps))
        return out

    def _tables(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [end, hd/2] float32 for positions 0..end-1, from float64 angles (the values
        ``ops.rope_neox`` computes per call)."""
        table = self._rope
        if table.shape[0] < end:
            with self._lock:
                table = self._rope
                if table.shape[0] < end:
                    size = max(end, 2 * table.shape[0], 256)
                    hd = self.config.head_dim
                    inv = self.config.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)  # [hd/2]
                    angles = torch.arange(size, dtype=torch.float64)[:, None] * inv[None, :]  # [size, hd/2]
                    table = torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.float32)  # [size, hd]
                    self._rope = table  # replaced whole: a reader keeps the one it took
        half = self.config.head_dim // 2
        return table[:end, :half], table[:end, half:]

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """NeoX RoPE of x [rows, heads, hd] at ``positions`` [rows] (positions ascending)."""
        lo, hi = int(positions[0]), int(positions[-1]) + 1
        cos, sin = self._tables(hi)
        if hi - lo == positions.shape[0]:
            cos, sin = cos[lo:hi], sin[lo:hi]  # [rows, hd/2]
        else:
            cos, sin = cos[positions], sin[positions]
        cos, sin = cos[:, None, :], sin[:, None, :]  # [rows, 1, hd/2]
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def _head_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Per-head RMSNorm of x [rows, heads, hd] (a view into a wider row is copied first)."""
        rows, heads, hd = x.shape
        return self._norm(x.reshape(rows * heads, hd).contiguous(), weight).view(rows, heads, hd)

    # -- passes --------------------------------------------------------------------------------
    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """Pass A: the context rows [n, H] of feature rows [n, taps * H_target]."""
        return self._norm(self.fc.linear(features.to(torch.float32).contiguous(), precision=self.precision), self.enc_norm)

    def context_kv(self, layer: int, context: torch.Tensor, positions: torch.Tensor):
        """Pass B for one layer (and a block's own keys): (k [n, nkv, hd] normed and turned,
        v [n, nkv, vd]) of rows [n, H] at ``positions`` [n]."""
        cfg, lw = self.config, self.layers[layer]
        n, kd = context.shape[0], cfg.n_head_kv * cfg.head_dim
        kv = lw.kv.linear(context, precision=self.precision)  # [n, k + v]
        if lw.bkv is not None:
            kv = kv + lw.bkv
        k = self.rope(self._head_norm(kv[:, :kd].view(n, cfg.n_head_kv, cfg.head_dim), lw.k_norm), positions)
        return k, kv[:, kd:].reshape(n, cfg.n_head_kv, cfg.value_dim)

    def prepare(self, x: torch.Tensor, positions: torch.Tensor, attends: list) -> "BlockState":
        """Pass C on the block's rows x [B, H] at ``positions`` [B] through every layer but the
        last, then the last layer's keys and values of every row: what ``finish`` needs to
        compute any subset of output rows. ``attends[layer](q, k, v, query_positions)`` ->
        [rows, nh*vd] is the head's attention over that layer's context store and the block."""
        last = len(self.layers) - 1
        for layer in range(last):
            x = self._rows(self._state(layer, x, positions, attends[layer]), 0, x.shape[0])
        return self._state(last, x, positions, attends[last])

    def finish(self, state: "BlockState", lo: int, hi: int) -> torch.Tensor:
        """Final-normed output rows ``lo..hi-1`` [hi - lo, H] of a prepared block: only those
        rows' queries, attention and FFN are computed (the last layer's output of a row needs
        every row's keys and values, which ``prepare`` made, and nothing else of theirs)."""
        return self._norm(self._rows(state, lo, hi), self.out_norm)

    def _state(self, layer: int, x: torch.Tensor, positions: torch.Tensor, attend) -> "BlockState":
        h = self._norm(x, self.layers[layer].attn_norm)  # [B, H]
        k, v = self.context_kv(layer, h, positions)
        return BlockState(layer, x, h, k, v, positions, attend)

    def _rows(self, state: "BlockState", lo: int, hi: int) -> torch.Tensor:
        """The residual rows ``lo..hi-1`` [n, H] after ``state``'s layer."""
        cfg, lw = self.config, self.layers[state.layer]
        rows, where = hi - lo, state.positions[lo:hi]
        q = lw.q.linear(state.h[lo:hi], precision=self.precision)  # [n, nh*hd]
        if lw.bq is not None:
            q = q + lw.bq
        q = self.rope(self._head_norm(q.view(rows, cfg.n_head, cfg.head_dim), lw.q_norm), where)
        attn = state.attend(q, state.k, state.v, where).contiguous()  # [n, nh*vd]
        x = lw.wo.linear(attn, state.x[lo:hi], precision=self.precision)  # [n, H]: x + W_o attn
        if lw.bo is not None:
            x = x + lw.bo
        gate_up = lw.gate_up.linear(self._norm(x, lw.ffn_norm), precision=self.precision)  # [n, 2F]
        act = torch.empty(rows, cfg.ffn_size)  # [n, F]
        self._k.silu_mul(gate_up.data_ptr(), act.data_ptr(), rows, cfg.ffn_size)
        return lw.down.linear(act, x, precision=self.precision)  # [n, H]: x + W_down act

    def scores(self, rows: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [n, K] of final-normed rows [n, H] (a file with a draft head)."""
        return self.draft_head.linear(rows.to(torch.float32).contiguous(), precision=self.precision)


@attrs.frozen
class BlockState:
    """A block pass stopped inside one layer: its input rows, their attention norm, every
    row's keys and values, and the layer's attention."""

    layer: int
    x: torch.Tensor  # [B, H] the layer's input (the residual)
    h: torch.Tensor  # [B, H] RMSNorm(x) for attention
    k: torch.Tensor  # [B, nkv, hd] normed and turned
    v: torch.Tensor  # [B, nkv, vd]
    positions: torch.Tensor  # [B]
    attend: Any  # (q, k, v, query_positions) -> [rows, nh*vd]
