"""ContextKV: the drafter's own K/V of committed context rows, addressed by absolute position.

A sliding layer keeps a ring: position ``p`` lives in slot ``p % rows`` and overwrites whatever
was there; ``rows`` exceeds the window plus the block, so a slot's previous occupant is always
out of every row's reach and is told apart by the position recorded beside it. A full-attention
layer keeps a linear store that grows (slot = position).

Nothing here trusts order: a rewind (a new sequence, a reused prefix) writes positions below
what the store has seen, and ``forget_from`` drops everything at or beyond a position so stale
rows of an earlier sequence can never be attended. The target's own KV cache is never touched.
"""

from __future__ import annotations

import torch

__all__ = ["ContextKV", "EMPTY"]

EMPTY = -1  # the position recorded in a slot that holds nothing
INITIAL_LINEAR_ROWS = 256


class ContextKV:
    """K/V rows of one drafter layer. ``rows=None``: a growable linear store."""

    def __init__(
        self, n_kv: int, head_dim: int, value_dim: int, *, rows: int | None, dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        self.ring = rows is not None
        capacity = rows if rows is not None else INITIAL_LINEAR_ROWS
        self.keys = torch.zeros((capacity, n_kv, head_dim), dtype=dtype, device=device)  # [rows, nkv, hd]
        self.values = torch.zeros((capacity, n_kv, value_dim), dtype=dtype, device=device)  # [rows, nkv, vd]
        self.positions = torch.full((capacity,), EMPTY, dtype=torch.long, device=device)  # [rows]

    @property
    def capacity(self) -> int:
        return int(self.positions.shape[0])

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        extra = capacity - self.capacity
        self.keys = torch.cat([self.keys, self.keys.new_zeros((extra, *self.keys.shape[1:]))])
        self.values = torch.cat([self.values, self.values.new_zeros((extra, *self.values.shape[1:]))])
        self.positions = torch.cat([self.positions, self.positions.new_full((extra,), EMPTY)])

    def write(self, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store rows at absolute ``positions`` [n] (ascending): keys [n, nkv, hd], values [n, nkv, vd].

        In a ring only the last ``rows`` of a long write survive, as they would one by one.
        """
        if positions.numel() == 0:
            return
        if self.ring:
            keep = min(positions.numel(), self.capacity)
            positions, keys, values = positions[-keep:], keys[-keep:], values[-keep:]
            slots = positions % self.capacity
        else:
            self._grow(int(positions.max()) + 1)
            slots = positions
        self.keys[slots] = keys
        self.values[slots] = values
        self.positions[slots] = positions

    def device_view(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """(keys, values, positions, ring rows or 0) for a kernel that writes ``positions``
        itself: slot ``p % rows`` in a ring, slot ``p`` in a linear store (grown first)."""
        if not self.ring:
            self._grow(int(positions.max()) + 1)
        return self.keys, self.values, self.positions, self.capacity if self.ring else 0

    def forget_from(self, position: int) -> None:
        """Drop every row at ``position`` or later (a rewind)."""
        self.positions[self.positions >= position] = EMPTY

    def clear(self) -> None:
        self.positions.fill_(EMPTY)

    def gather(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows with ``lo <= position < hi``: (keys [m, nkv, hd], values [m, nkv, vd], positions [m])."""
        pos = self.positions
        slots = torch.nonzero((pos >= max(lo, 0)) & (pos < hi)).flatten()
        return self.keys[slots], self.values[slots], pos[slots]

    def max_position(self) -> int:
        """The highest stored position, or EMPTY."""
        return int(self.positions.max()) if self.capacity else EMPTY
