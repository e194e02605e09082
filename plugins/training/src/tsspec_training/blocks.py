"""Block windows for block drafters (DFlash-style): anchors, label windows, padded batches.

A block drafter proposes ``B - 1`` tokens at once. Its training example is one ANCHOR position
``a`` of a teacher-forced sequence: the drafter sees the target's tapped residuals of positions
``0 .. a-1`` (its context), the anchor token ``tokens[a]`` and ``B - 1`` mask rows, and block
row ``i`` (``1 <= i < B``) is trained toward ``labels[a + i - 1]``: the TARGET's argmax at row
``a + i - 1``, i.e. the token verification would emit at position ``a + i``.

    tokens   t0  t1  t2 [t3] t4  t5        anchor a = 3, B = 4
    context  f0  f1  f2                    (tapped rows of positions < a)
    block        [t3, M, M, M]             rows at positions 3..6
    targets          -, y3, y4, y5         y_j = target argmax at row j

Everything here is generic over the drafter: the plugin that owns a block kind turns a
``BlockBatch`` into its own forward and loss.
"""

from __future__ import annotations

import math
from typing import Sequence

import attrs
import torch

from .teacher import TeacherSequence

__all__ = ["BlockBatch", "default_taps", "sample_anchors", "block_labels", "position_weights", "make_batch",
           "least_used_token", "expected_accepted"]

IGNORE = -100


def default_taps(num_layers: int, count: int = 3) -> tuple[int, ...]:
    """``count`` target layers spread over the depth, in the GGUF tap convention (the residual
    ENTERING a layer, 0..num_layers): the outputs of layers 1 .. L-3, as DFlash's authors space
    them, shifted by one; a shallow model spreads them over every layer."""
    if num_layers < 1:
        raise ValueError(f"a target of {num_layers} layers has nothing to tap")
    count = max(1, min(int(count), num_layers))
    first, last = 1, num_layers - 3
    if last - first < count - 1:  # a shallow model: spread over every layer output instead
        first, last = 0, num_layers - 1
    if count == 1:
        outputs = [num_layers // 2]
    else:
        outputs = [round(first + i * (last - first) / (count - 1)) for i in range(count)]
    return tuple(sorted({min(num_layers, o + 1) for o in outputs}))


def sample_anchors(length: int, count: int, generator: torch.Generator, *, min_context: int = 1) -> torch.Tensor:
    """Up to ``count`` distinct anchor positions in ``[min_context, length - 1)`` (each has at
    least one label), ascending; [n] int64. Fewer when the sequence is short."""
    lo, hi = int(min_context), int(length) - 1
    if hi <= lo:
        return torch.zeros(0, dtype=torch.long)
    span = hi - lo
    picks = torch.randperm(span, generator=generator)[: min(int(count), span)] + lo
    return torch.sort(picks).values


def block_labels(labels: torch.Tensor, anchors: torch.Tensor, block_size: int, ignore: int = IGNORE) -> torch.Tensor:
    """[n, B-1]: row ``i-1`` of anchor ``a`` is ``labels[a + i - 1]``, ``ignore`` past the end."""
    offsets = torch.arange(block_size - 1)  # [B-1]
    index = anchors[:, None] + offsets[None, :]  # [n, B-1]
    inside = index < labels.shape[0]
    return torch.where(inside, labels[index.clamp(max=labels.shape[0] - 1)], torch.full_like(index, ignore))


def position_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """[B-1] loss weights ``exp(-(i-1)/gamma)`` for block rows 1..B-1: an early miss ends a
    block, so early rows matter most. ``gamma`` None or <= 0: uniform."""
    i = torch.arange(block_size - 1, dtype=torch.float32)
    if not gamma or gamma <= 0:
        return torch.ones_like(i)
    return torch.exp(-i / float(gamma))


def least_used_token(sequences: Sequence[TeacherSequence], vocab_size: int, candidates: Sequence[int] = ()) -> int:
    """A token the data uses least (inputs and labels): what a block drafter can use as its mask
    row without colliding with real text. ``candidates`` (e.g. special tokens) are preferred
    when one of them is as rare as the rarest; ties go to the lower id."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in sequences:
        counts += torch.bincount(s.tokens, minlength=vocab_size)[:vocab_size]
        counts += torch.bincount(s.labels, minlength=vocab_size)[:vocab_size]
    rarest = int(counts.min())
    for c in candidates:
        if 0 <= int(c) < vocab_size and int(counts[int(c)]) == rarest:
            return int(c)
    return int(torch.nonzero(counts == rarest)[0])


@attrs.frozen
class BlockBatch:
    """Padded sequences and their anchors; padding anchors have ``anchor_ok`` False."""

    tokens: torch.Tensor  # [b, L] int64
    features: torch.Tensor  # [b, L, F] float32: tapped rows of each position
    anchors: torch.Tensor  # [b, n] int64 (0 where padding)
    anchor_ok: torch.Tensor  # [b, n] bool
    labels: torch.Tensor  # [b, n, B-1] int64 target ids, IGNORE where absent

    def to(self, device: torch.device) -> "BlockBatch":
        return BlockBatch(*(t.to(device) for t in attrs.astuple(self, recurse=False)))


def make_batch(items: Sequence[TeacherSequence], block_size: int, anchors_per_sequence: int,
               generator: torch.Generator | None, *, min_context: int = 1) -> BlockBatch:
    """A ``BlockBatch`` of ``items``; anchors drawn from ``generator`` (None: every position
    from ``min_context`` on whose whole window is labelled, for evaluation)."""
    L = max(len(s.tokens) for s in items)
    b, width = len(items), items[0].hidden.shape[1]
    picks = []
    for s in items:
        n = len(s.tokens)
        if generator is None:
            picks.append(torch.arange(min_context, max(min_context, n - block_size + 2), dtype=torch.long))
        else:
            picks.append(sample_anchors(n, anchors_per_sequence, generator, min_context=min_context))
    count = max(1, max(p.numel() for p in picks))
    tokens = torch.zeros(b, L, dtype=torch.long)
    features = torch.zeros(b, L, width)
    anchors = torch.zeros(b, count, dtype=torch.long)
    ok = torch.zeros(b, count, dtype=torch.bool)
    labels = torch.full((b, count, block_size - 1), IGNORE, dtype=torch.long)
    for row, (s, p) in enumerate(zip(items, picks)):
        n = len(s.tokens)
        tokens[row, :n] = s.tokens
        features[row, :n] = s.hidden.float()
        anchors[row, : p.numel()] = p
        ok[row, : p.numel()] = True
        if p.numel():
            labels[row, : p.numel()] = block_labels(s.labels, p, block_size)
    return BlockBatch(tokens, features, anchors, ok, labels)


def expected_accepted(hits: torch.Tensor) -> float:
    """Mean accepted prefix length of [n, B-1] per-row hits (bool): a block's drafts count
    until the first miss, as greedy verification counts them."""
    if hits.numel() == 0:
        return math.nan
    return float(hits.long().cumprod(dim=-1).sum(-1).float().mean())
