"""``PagedQwen35KV``: the hybrid trunk's KV in fixed-size blocks, recurrent state per sequence.

Storage: per full-attention layer, K and V pools ``[n_kv, num_blocks * block_size, hd]`` in the
trunk's dtype; position ``p`` of a sequence lives at slot ``blocks[p // B] * B + p % B``. Per
GDN layer, each live sequence (``PagedRows.seq``) owns a ``DeltaNetState`` (conv window + delta
state), created at its first forward and dropped by ``release(seq)``.

Exactness: a trunk call's rows are row-count invariant only on the float32 kernels and only up
to ``ops.ROWWISE_MAX`` rows (torch's matmuls and a long prefill's chunked recurrence are not),
so the rows of different sequences are NOT stacked. Each
sequence's rows run through the very trunk call its solo run makes (``Qwen35Trunk.forward`` over
its own rows, commit or slots mode): its attention layers see a contiguous K/V buffer gathered
from its blocks, whose new rows are scattered back afterwards. A sequence's logits therefore
equal its solo linear-path run bit for bit, in any batch; the cost is one trunk call per
sequence per step (no shared weight reads) plus one gather of its keys per attention layer.
Prefills are not chunked either (``row_invariant = False`` tells the scheduler), as the solo
run forwards a prompt in one call.

Rollback mirrors ``Qwen35Target``: a verify of at most ``MAX_SLOT_ROWS`` rows (per-row snapshots
on) leaves the live state untouched and emits one state slot per row; ``keep(seq, m)`` commits
slot ``m - 1``. A wider verify (or snapshots off) copies the state it starts from and advances
the live state; ``keep`` of a prefix restores the copy and re-forwards the kept rows at that
sequence's next forward (their K/V are already in its blocks and are rewritten identically).

Prefix reuse: a GDN state resumes only where it was saved, and a resumed state followed by the
rest of a prompt does not reproduce the solo one-call prefill bit for bit, so this KV refuses
adopted prefixes (``resumes_prefix = False``; the scheduler then neither adopts nor counts
them, and its snapshot says why).
"""

from __future__ import annotations

from typing import Sequence

import attrs
import torch

from tsspec.protocols import PagedRows

from .attention import KVCache
from .deltanet import DeltaNetLayer, DeltaNetSlots, DeltaNetState
from .trunk import TrunkState

PREFIX_REFUSAL = "a hybrid trunk's recurrent state cannot resume at an adopted prefix exactly"


@attrs.define
class _Pending:
    """A verify not yet resolved by ``keep``: its slots, or the state it started from."""

    start: int
    tokens: list[int]
    slots: dict[int, DeltaNetSlots] | None
    saved: dict[int, DeltaNetState] | None = None


@attrs.define
class _Reforward:
    """Kept rows of a restore-path verify, re-forwarded at the sequence's next forward."""

    start: int
    tokens: list[int]


@attrs.define
class _Sequence:
    state: dict[int, DeltaNetState]  # per GDN layer
    pending: _Pending | None = None
    reforward: _Reforward | None = None


class _BlockView(KVCache):
    """A contiguous K/V buffer of one sequence's positions 0 .. end-1 (gathered from blocks)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values  # [nkv, end, hd]


class PagedQwen35KV:
    """Block-paged attention KV and per-sequence recurrent state bound to a ``Qwen35Target``."""

    row_invariant = False  # rows of different sequences are never stacked (see the docstring)
    resumes_prefix = False
    prefix_refusal = PREFIX_REFUSAL

    def __init__(self, target, num_blocks: int, block_size: int, max_batch_rows: int = 64):
        hp = target.hp
        self.target = target
        self.trunk = target.trunk
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_batch_rows = max_batch_rows
        self._attn = [i for i, m in enumerate(self.trunk.mixers) if not isinstance(m, DeltaNetLayer)]
        slots = num_blocks * block_size
        shape = (len(self._attn), hp.num_kv_heads, slots, hp.head_dim)
        kw = dict(dtype=self.trunk.dtype, device=self.trunk.device)
        self._k = torch.zeros(shape, **kw)  # [attn layers, nkv, slots, hd]
        self._v = torch.zeros(shape, **kw)
        self._seqs: dict[int, _Sequence] = {}

    @staticmethod
    def bytes_per_block(target, block_size: int) -> int:
        hp, trunk = target.hp, target.trunk
        attn = sum(1 for m in trunk.mixers if not isinstance(m, DeltaNetLayer))
        elem = torch.empty((), dtype=trunk.dtype).element_size()
        return max(1, 2 * attn * hp.num_kv_heads * block_size * hp.head_dim * elem)

    @property
    def live_sequences(self) -> int:
        return len(self._seqs)

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
        return (table[:, None] * b + torch.arange(b)[None, :]).reshape(-1)[:end].to(self._k.device)

    # -- per-sequence state ------------------------------------------------------------------
    def _sequence(self, seq: int, past: int) -> _Sequence:
        s = self._seqs.get(seq)
        if s is None:
            if past:
                raise ValueError(f"sequence {seq} has no recurrent state at position {past} ({PREFIX_REFUSAL})")
            fresh = self.trunk.new_state()
            s = self._seqs[seq] = _Sequence({i: st for i, st in fresh.recurrent()})
        return s

    def keep(self, seq: int, rows_kept: int) -> str:
        """Keep the first ``rows_kept`` rows of ``seq``'s last verify; returns the mode."""
        s = self._seqs.get(seq)
        pending = s.pending if s is not None else None
        if pending is None:
            raise ValueError(f"sequence {seq} has no verify to keep rows of")
        rows = len(pending.tokens)
        if not 1 <= rows_kept <= rows:
            raise ValueError(f"cannot keep {rows_kept} rows of a verify of {rows}")
        s.pending = None
        if pending.slots is not None:
            self._trunk_state(s, None).commit_slots(pending.slots, rows_kept - 1)
            self.target.counters.slot_commits += 1
            return "committed"
        if rows_kept == rows:
            return "committed" if self.target.per_row_snapshots else "all"
        for i, st in s.state.items():
            st.copy_from(pending.saved[i])
        self.target.counters.state_restores += 1
        s.reforward = _Reforward(pending.start, pending.tokens[:rows_kept])
        return "committed" if self.target.per_row_snapshots else "reforward"

    def release(self, seq: int) -> None:
        """Forget ``seq`` (finished or cancelled): its recurrent state slot is freed."""
        self._seqs.pop(seq, None)

    # -- the forward -------------------------------------------------------------------------
    def _trunk_state(self, s: _Sequence, views: dict[int, KVCache] | None) -> TrunkState:
        per_layer = [s.state.get(i) if i in s.state else (views or {}).get(i) for i in range(len(self.trunk.mixers))]
        return TrunkState(per_layer)

    def _run(self, s: _Sequence, blocks: Sequence[int], start: int, tokens: list[int], slots: bool):
        """One trunk call over one sequence's rows at ``start ..``; K/V gathered and written back."""
        end = start + len(tokens)
        where = self._slots(blocks, end)  # [end]
        views: dict[int, KVCache] = {}
        for j, layer in enumerate(self._attn):
            views[layer] = _BlockView(self._k[j].index_select(1, where), self._v[j].index_select(1, where))
        out = self.trunk.forward(tokens, start, self._trunk_state(s, views), slots=slots, taps=self.target._taps)
        new = where[start:]
        for j, layer in enumerate(self._attn):
            self._k[j][:, new] = views[layer].keys[:, start:end]
            self._v[j][:, new] = views[layer].values[:, start:end]
        return out

    def forward(self, batch: Sequence[PagedRows]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Per sequence: (logits [rows or 1, vocab], hidden [rows, feature] or None), each from
        the same trunk call its solo run makes."""
        from .target import MAX_SLOT_ROWS

        target, vocab = self.target, self.target.hp.vocab_size
        outputs = []
        with torch.no_grad():  # as the solo path: committed slot buffers become live state
            for r in batch:
                tokens = [int(t) for t in r.tokens]
                if not tokens:
                    raise ValueError("every sequence in a batch brings at least one row")
                if min(tokens) < 0 or max(tokens) >= vocab:
                    raise ValueError(f"token ids must lie in [0, {vocab})")
                if r.past + len(tokens) > target.max_context_length:
                    raise ValueError(f"{r.past + len(tokens)} positions exceed the context of {target.max_context_length}")
                s = self._sequence(r.seq, r.past)
                if s.pending is not None:
                    raise RuntimeError(f"sequence {r.seq}: the previous verify was not resolved by keep")
                if s.reforward is not None:
                    redo, s.reforward = s.reforward, None
                    self._run(s, r.blocks, redo.start, redo.tokens, slots=False)
                    target.counters.forward_calls += 1
                    target.counters.forward_rows += len(redo.tokens)
                verify = r.all_logits
                slots = verify and target.per_row_snapshots and len(tokens) <= MAX_SLOT_ROWS
                saved = None
                if verify and not slots:
                    saved = {i: st.clone() for i, st in s.state.items()}
                    target.counters.state_snapshots += not target.per_row_snapshots
                out = self._run(s, r.blocks, r.past, tokens, slots)
                target.counters.forward_calls += 1
                target.counters.forward_rows += len(tokens)
                if verify:
                    s.pending = _Pending(r.past, tokens, out.slots, saved)
                taps = target._taps
                need_normed = r.want_hidden and not taps
                last = out.residual if (r.all_logits or need_normed) else out.residual[-1:]
                normed = self.trunk.final_norm(last)  # [rows or 1, H]
                logits = self.trunk.lm_head(normed if r.all_logits else normed[-1:])
                hidden = (out.taps if taps else normed) if r.want_hidden else None
                logits = logits.cpu()
                hidden = hidden.cpu() if hidden is not None else None
                outputs.append((logits, hidden))
        return outputs


def open_paged(target, num_blocks: int, block_size: int) -> PagedQwen35KV:
    """The paged KV of ``target``, or a ValueError saying why this load has none."""
    if target.device.type != "cpu":
        raise ValueError("the qwen35 batched paged path is checked on the CPU only (--device cpu)")
    if num_blocks < 1 or block_size < 1:
        raise ValueError(f"a paged KV needs >= 1 block of >= 1 token, got {num_blocks} x {block_size}")
    return PagedQwen35KV(target, num_blocks, block_size)
