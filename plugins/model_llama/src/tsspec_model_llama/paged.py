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
length as the head stride. A sequence whose blocks are consecutive in the pool (the usual case
for a lone stream: the pool hands out blocks in order) is not gathered: the kernel reads its
keys in the pool itself, with the pool's slot count as the head stride (the same numbers in
the same order, so the same rows, without copying its whole KV every layer and step). A batch
of one such sequence (a lone stream's every step) runs as the linear cache's single native call
(``model_step``) on the pool's slots: the pool is laid out as that cache is, ``[layers, n_kv,
slots, hd]``, so the sequence's first slot and the pool's slot count stand for the cache and its
capacity, and the step costs what ``tsspec generate``'s does.

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
from tsspec_gguf.rowops import TORCH_SERIAL_VALUES
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
        # the one-call step's scratch (the target's own is its linear cache's): [2 * GEMM_ROWS, H]
        self._work = torch.empty((2 * GEMM_ROWS, hp.hidden_size), dtype=torch.float32)

    @staticmethod
    def bytes_per_block(target, block_size: int) -> int:
        hp = target.hparams
        return 2 * hp.n_layers * hp.n_kv_heads * block_size * hp.head_dim * 4

    def copy_block(self, src: int, dst: int) -> None:
        b = self.block_size
        self._k[:, :, dst * b : (dst + 1) * b] = self._k[:, :, src * b : (src + 1) * b]
        self._v[:, :, dst * b : (dst + 1) * b] = self._v[:, :, src * b : (src + 1) * b]

    def _first_slot(self, blocks: Sequence[int], end: int) -> int | None:
        """The pool slot of position 0 when positions 0 .. end-1 lie in consecutive blocks (the
        kernel can read them in place), else None."""
        used = -(-end // self.block_size)
        first = int(blocks[0]) if used else 0
        if used > len(blocks) or any(int(blocks[j]) != first + j for j in range(1, used)):
            return None
        return first * self.block_size

    def _slots(self, blocks: Sequence[int], end: int) -> torch.Tensor:
        """Pool slots of positions 0 .. end-1 -> [end] long."""
        b = self.block_size
        table = torch.as_tensor(list(blocks), dtype=torch.long)
        if table.numel() * b < end:
            raise ValueError(f"{table.numel()} blocks hold {table.numel() * b} positions, not {end}")
        return (table[:, None] * b + torch.arange(b)[None, :]).reshape(-1)[:end]

    def _one_call(self, r: PagedRows, first: int):
        """A lone sequence's rows in one native call on the pool (see the module docstring):
        (logits, hidden), or None where the target's own step would not take one call either
        (no native head, int8 arithmetic, final-norm hidden rows without every row's logits,
        a head too wide for the kernels' norm)."""
        target, hp = self.target, self.target.hparams
        head_parts = target._step_head
        rows = len(r.tokens)
        kept = rows if r.all_logits else 1
        taps = target._taps
        if (head_parts is None or not target.native_step or not target.fused_blocks or target.precision == "int8"
                or (r.want_hidden and taps is None and kept < rows) or kept * hp.hidden_size >= TORCH_SERIAL_VALUES):
            return None
        ids = [int(t) for t in r.tokens]
        embed, lm_head, lanes, norm_weight, _ = head_parts
        table = target._rope.address(r.past + rows)  # [pos, half, 2]
        logits = torch.empty((kept, hp.vocab_size), dtype=torch.float32)
        tapped = torch.empty((rows, len(taps) * hp.hidden_size), dtype=torch.float32) if r.want_hidden and taps else None
        normed = torch.empty((kept, hp.hidden_size), dtype=torch.float32) if r.want_hidden and not taps else None
        work = self._work.data_ptr()
        normed_at = work + rows * hp.hidden_size * 4 if normed is None else normed.data_ptr()  # bytes
        head = (norm_weight, target._eps, lanes, normed_at, rows - kept, lm_head, logits.data_ptr())
        taps_arg = () if tapped is None else ((taps, tapped.data_ptr()),)
        at = first * hp.head_dim * self._k.element_size()  # bytes to the sequence's position 0
        target._step_kernels.model_step(
            target._stack, ids, embed, work, r.past, self._k.data_ptr() + at, self._v.data_ptr() + at,
            self._k.shape[2], table, torch.get_num_threads(), False, head, *taps_arg,
        )
        hidden = normed if tapped is None else tapped
        return logits, (hidden if r.want_hidden else None)

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
        if len(batch) == 1 and len(ids) <= GEMM_ROWS:
            first = self._first_slot(batch[0].blocks, ends[0])
            step = None if first is None else self._one_call(batch[0], first)
            if step is not None:
                return [step]
        slots = [self._slots(r.blocks, end) for r, end in zip(batch, ends)]  # [end] each
        new_slots = torch.cat([where[r.past :] for r, where in zip(batch, slots)])  # [R]
        # keys read in place (consecutive blocks: their first slot) or gathered (None)
        firsts = [self._first_slot(r.blocks, end) for r, end in zip(batch, ends)]
        gathered = [i for i, first in enumerate(firsts) if first is None]
        every_slot = torch.cat([slots[i] for i in gathered]) if gathered else None  # [sum of their ends]
        offsets = [0] * len(batch)  # each gathered sequence's first key in the gather buffer
        span = 0
        for i in gathered:
            offsets[i], span = span, span + ends[i]
        pool_slots = self._k.shape[2]
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
            qkv = _linear(h, layer.wqkv, layer.bqkv, target.precision)  # [R, (nh + 2 nkv) hd]; Q pre-scaled
            attn = torch.empty((total, hp.q_size), dtype=torch.float32)  # [R, nh * hd]
            k_pool, v_pool = self._k[i], self._v[i]  # [nkv, slots, hd]
            for r, (a, b) in zip(batch, spans):
                kernels.rope(qkv[a].data_ptr(), qkv.stride(0), b - a, target._qk_heads, hd, hp.rope_dim, rope_table, r.past)
            k_pool[:, new_slots] = qkv[:, hp.q_size : target._qk_size].view(total, nkv, hd).transpose(0, 1)
            v_pool[:, new_slots] = qkv[:, target._qk_size :].view(total, nkv, hd).transpose(0, 1)
            if every_slot is not None:
                k_all = k_pool.index_select(1, every_slot)  # [nkv, span, hd], contiguous
                v_all = v_pool.index_select(1, every_slot)
            row_bytes = hd * k_pool.element_size()
            for r, (a, b), offset, first in zip(batch, spans, offsets, firsts):
                # the kernel reads head h of this sequence at k + h * cap * hd, key j at + j * hd
                if first is None:
                    k_at, v_at, cap = k_all.data_ptr() + offset * row_bytes, v_all.data_ptr() + offset * row_bytes, span
                else:
                    k_at, v_at, cap = k_pool.data_ptr() + first * row_bytes, v_pool.data_ptr() + first * row_bytes, pool_slots
                for start in range(a, b, ROW_SLICE):
                    stop = min(b, start + ROW_SLICE)
                    kernels.attention(
                        qkv[start].data_ptr(), qkv.stride(0), k_at, v_at, cap, attn[start].data_ptr(), stop - start,
                        hp.n_heads, nkv, hd, r.past + start - a, threads,
                    )
            x = target._residual_add(x, attn, layer.wo, layer.bo)
            h = torch.empty_like(x)
            kernels.rms_norm(x.data_ptr(), layer.ffn_norm.data_ptr(), h.data_ptr(), total, H, target._eps)
            gate_up = _linear(h, layer.w_gate_up, None, target.precision)  # [R, 2 F]
            act = torch.empty((total, hp.ffn_size), dtype=torch.float32)
            kernels.silu_mul(gate_up.data_ptr(), act.data_ptr(), total, hp.ffn_size)
            x = target._residual_add(x, act, layer.w_down, None)
        tapped[hp.n_layers] = x
        # the LM head runs on the rows whose logits are wanted: all rows of a verify, the last
        # row of a plain step or prefill chunk
        picks = [list(range(a, b)) if r.all_logits else [b - 1] for r, (a, b) in zip(batch, spans)]
        flat = [p for pick in picks for p in pick]
        normed = F.rms_norm(x[flat], target._norm_shape, target._output_norm, target._eps)  # [L, H]
        logits = _linear(normed, target._lm_head, None, target.precision).to(OUTPUT_DEVICE, torch.float32)  # [L, vocab]
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
