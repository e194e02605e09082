"""``PagedLlamaKV``: a llama target's KV in fixed-size blocks and one forward over a ragged batch.

Storage: per layer, K and V pools ``[n_kv, num_blocks * block_size, hd]`` (float32). A sequence
brings its block table (which blocks hold its positions 0, 1, ...), its length ``past`` and its
new rows: 1 for a plain step, k+1 for a verify, up to a chunk of a prefill. Position ``p`` of a
sequence lives at slot ``blocks[p // B] * B + p % B`` of the pools.

One forward runs every sequence's rows together: the rows are stacked ``[R, H]`` and every
weight matmul (block kernels, row-invariant) and RMSNorm covers all of them at once; RoPE and
attention run per sequence (its own positions, its own keys). Attention gathers the sequence's
keys into a contiguous ``[n_kv, past + rows, hd]`` buffer and calls the same causal kernel as
the linear cache, so each row is computed exactly as in a single-sequence forward: a sequence's
logits do not depend on which sequences share the batch (batch invariance, bit for bit). Per
layer, one gather serves the whole batch: every sequence's keys side by side in one buffer
``[n_kv, sum of lengths, hd]``, and the kernel reads sequence i at its offset with the buffer's
length as the head stride.

That holds on the compiled CPU float32 path with every matrix in blocks and at most
``GEMM_ROWS`` rows per call (the fused stack's bound): ``max_batch_rows`` says so and the
scheduler never exceeds it, prefills included (they go in chunks; every kernel row is
batch-invariant, so a chunked prefill equals a solo one). Other paths (CUDA, bf16, dense float32 weights) are not offered (``spec_open_paged``
raises).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from tsspec_gguf.attention import ROW_SLICE
from tsspec_gguf.qlinear import GEMM_ROWS, BlockMatrix
from tsspec.protocols import PagedRows

from .target import OUTPUT_DEVICE, _embedding, _linear


class PagedLlamaKV:
    """Block-paged KV storage bound to a ``LlamaTarget`` (its weights, its kernels)."""

    def __init__(self, target, num_blocks: int, block_size: int):
        hp = target.hparams
        self.target = target
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_batch_rows = GEMM_ROWS
        slots = num_blocks * block_size
        shape = (hp.n_layers, hp.n_kv_heads, slots, hp.head_dim)
        self._k = torch.zeros(shape, dtype=torch.float32)  # [layers, nkv, slots, hd]
        self._v = torch.zeros(shape, dtype=torch.float32)

    @staticmethod
    def bytes_per_block(target, block_size: int) -> int:
        hp = target.hparams
        return 2 * hp.n_layers * hp.n_kv_heads * block_size * hp.head_dim * 4

    def copy_block(self, src: int, dst: int) -> None:
        b = self.block_size
        self._k[:, :, dst * b : (dst + 1) * b] = self._k[:, :, src * b : (src + 1) * b]
        self._v[:, :, dst * b : (dst + 1) * b] = self._v[:, :, src * b : (src + 1) * b]

    def _slots(self, blocks: Sequence[int], end: int) -> torch.Tensor:
        """Pool slots of positions 0 .. end-1 -> [end] long."""
        b = self.block_size
        table = torch.as_tensor(list(blocks), dtype=torch.long)
        if table.numel() * b < end:
            raise ValueError(f"{table.numel()} blocks hold {table.numel() * b} positions, not {end}")
        return (table[:, None] * b + torch.arange(b)[None, :]).reshape(-1)[:end]

    @torch.inference_mode()
    def forward(self, batch: Sequence[PagedRows]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Run every sequence's rows in one pass; per sequence (logits [1 or rows, vocab],
        hidden [rows, feature] or None), float32."""
        target, hp = self.target, self.target.hparams
        kernels = target._kernels
        if not batch:
            return []
        total = sum(len(r.tokens) for r in batch)
        if total > self.max_batch_rows:
            raise ValueError(f"a paged forward takes at most {self.max_batch_rows} rows, got {total}")
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        vocab = hp.vocab_size
        for r in batch:
            if not r.tokens:
                raise ValueError("every sequence in a batch brings at least one row")
            spans.append((len(ids), len(ids) + len(r.tokens)))
            ids.extend(int(t) for t in r.tokens)
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"token ids must lie in [0, {vocab})")
        ends = [r.past + len(r.tokens) for r in batch]
        if max(ends) > target.max_context_length:
            raise ValueError(f"{max(ends)} positions exceed the context of {target.max_context_length}")
        slots = [self._slots(r.blocks, end) for r, end in zip(batch, ends)]  # [end] each
        every_slot = torch.cat(slots)  # [sum of ends]: all keys of the batch, side by side
        new_slots = torch.cat([where[r.past :] for r, where in zip(batch, slots)])  # [R]
        offsets = [0]
        for end in ends:
            offsets.append(offsets[-1] + end)
        span = offsets[-1]
        threads = torch.get_num_threads()
        target._rope.ensure(max(ends))
        rope_table = torch.view_as_real(target._rope._rot).data_ptr()
        taps = target._taps
        tapped: dict[int, torch.Tensor] = {}
        H, hd, nkv = hp.hidden_size, hp.head_dim, hp.n_kv_heads
        x = _embedding(torch.tensor(ids), target._embed)  # [R, H]
        for i, layer in enumerate(target._layers):
            if taps is not None and i in taps:
                tapped[i] = x
            h = torch.empty_like(x)
            kernels.rms_norm(x.data_ptr(), layer.attn_norm.data_ptr(), h.data_ptr(), total, H, target._eps)
            qkv = _linear(h, layer.wqkv, layer.bqkv)  # [R, (nh + 2 nkv) hd]; Q pre-scaled
            attn = torch.empty((total, hp.q_size), dtype=torch.float32)  # [R, nh * hd]
            k_pool, v_pool = self._k[i], self._v[i]  # [nkv, slots, hd]
            for r, (a, b) in zip(batch, spans):
                kernels.rope(qkv[a].data_ptr(), qkv.stride(0), b - a, target._qk_heads, hd, hp.rope_dim, rope_table, r.past)
            k_pool[:, new_slots] = qkv[:, hp.q_size : target._qk_size].view(total, nkv, hd).transpose(0, 1)
            v_pool[:, new_slots] = qkv[:, target._qk_size :].view(total, nkv, hd).transpose(0, 1)
            k_all = k_pool.index_select(1, every_slot)  # [nkv, span, hd], contiguous
            v_all = v_pool.index_select(1, every_slot)
            row_bytes = hd * k_all.element_size()
            for r, (a, b), offset in zip(batch, spans, offsets):
                # the kernel reads head h of this sequence at k + h * span * hd, key j at + j * hd
                for start in range(a, b, ROW_SLICE):
                    stop = min(b, start + ROW_SLICE)
                    kernels.attention(
                        qkv[start].data_ptr(), qkv.stride(0), k_all.data_ptr() + offset * row_bytes,
                        v_all.data_ptr() + offset * row_bytes, span, attn[start].data_ptr(), stop - start,
                        hp.n_heads, nkv, hd, r.past + start - a, threads,
                    )
            x = target._residual_add(x, attn, layer.wo, layer.bo)
            h = torch.empty_like(x)
            kernels.rms_norm(x.data_ptr(), layer.ffn_norm.data_ptr(), h.data_ptr(), total, H, target._eps)
            gate_up = _linear(h, layer.w_gate_up)  # [R, 2 F]
            act = torch.empty((total, hp.ffn_size), dtype=torch.float32)
            kernels.silu_mul(gate_up.data_ptr(), act.data_ptr(), total, hp.ffn_size)
            x = target._residual_add(x, act, layer.w_down, None)
        tapped[hp.n_layers] = x
        # the LM head runs on the rows whose logits are wanted: all rows of a verify, the last
        # row of a plain step or prefill chunk
        picks = [list(range(a, b)) if r.all_logits else [b - 1] for r, (a, b) in zip(batch, spans)]
        flat = [p for pick in picks for p in pick]
        normed = F.rms_norm(x[flat], target._norm_shape, target._output_norm, target._eps)  # [L, H]
        logits = _linear(normed, target._lm_head).to(OUTPUT_DEVICE, torch.float32)  # [L, vocab]
        out: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        at = 0
        for r, (a, b), pick in zip(batch, spans, picks):
            rows_logits = logits[at : at + len(pick)]
            at += len(pick)
            hidden = None
            if r.want_hidden:
                if taps is not None:
                    hidden = torch.cat([tapped[t][a:b] for t in taps], dim=-1)
                else:
                    hidden = F.rms_norm(x[a:b], target._norm_shape, target._output_norm, target._eps)
                hidden = hidden.to(OUTPUT_DEVICE, torch.float32)
            out.append((rows_logits, hidden))
        return out


def open_paged(target, num_blocks: int, block_size: int) -> PagedLlamaKV:
    """The paged KV of ``target``, or a ValueError saying why this target has none."""
    if target._kernels is None or not target.block_weights or target.dtype != torch.float32:
        raise ValueError(
            "the batched paged path needs the CPU float32 block-kernel path "
            "(--device cpu, default dtype, a build with the compiled kernels)"
        )
    if not target.hparams.family.llama_block:
        raise ValueError(f"the batched paged path runs llama's block; {target.hparams.architecture} adds to it "
                         "(per-head norms, post norms, sliding windows or soft-capping)")
    if not all(isinstance(w, BlockMatrix) for layer in target._layers for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)):
        raise ValueError("the batched paged path needs every matrix in blocks")
    return PagedLlamaKV(target, num_blocks, block_size)
