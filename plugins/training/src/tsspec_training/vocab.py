"""The FR-Spec draft vocabulary: the K target tokens the target itself predicts most often.

On a small model the full LM head is a large share of a step (49,152 x 576 on SmolLM2 is ~20%
of a target step); a drafter that scores only the K most frequent predictions costs a fraction
of that. Tokens outside the draft vocabulary are never proposed; verification is unchanged, so
output is identical.
"""

from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["draft_vocabulary", "label_counts", "mixed_counts", "top_ids", "coverage", "to_draft_labels"]


def label_counts(label_sets: Iterable[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """How often each id occurs among the teacher labels, [vocab_size] float64."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for labels in label_sets:
        counts += torch.bincount(labels.reshape(-1), minlength=vocab_size)[:vocab_size].to(torch.float64)
    return counts


def mixed_counts(groups: Iterable[tuple[Iterable[torch.Tensor], float]], vocab_size: int) -> torch.Tensor:
    """Label frequencies of several groups, each normalised to its ``share`` of the mass: the
    frequencies a trainer sees when it draws that share of its batches from each group."""
    total = torch.zeros(vocab_size, dtype=torch.float64)
    for label_sets, share in groups:
        counts = label_counts(label_sets, vocab_size)
        if share > 0 and counts.sum() > 0:
            total += share * counts / counts.sum()
    return total


def top_ids(counts: torch.Tensor, k: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``k`` ids of highest count (ties to the lower id), ``always`` included; sorted
    ascending, [min(k, vocab)] int64."""
    counts = counts.to(torch.float64).clone()
    vocab_size = counts.numel()
    forced = sorted({int(t) for t in always if 0 <= int(t) < vocab_size})
    for t in forced:
        counts[t] = float("inf")
    k = min(int(k), vocab_size)
    # stable order: by count descending, then id ascending
    order = torch.argsort(-counts, stable=True)
    return torch.sort(order[:k]).values


def draft_vocabulary(label_sets: Iterable[torch.Tensor], vocab_size: int, k: int,
                     always: Iterable[int] = ()) -> torch.Tensor:
    """The ``k`` most frequent ids among the teacher labels (ties to the lower id), plus
    ``always`` (e.g. end-of-generation ids); sorted ascending, [min(k, vocab)] int64."""
    return top_ids(label_counts(label_sets, vocab_size), k, always)


def coverage(label_sets: Iterable[torch.Tensor], draft_ids: torch.Tensor) -> float:
    """Share of teacher labels inside the draft vocabulary."""
    hit = total = 0
    table = torch.zeros(int(draft_ids.max()) + 2, dtype=torch.bool)
    table[draft_ids] = True
    for labels in label_sets:
        inside = labels < table.shape[0]
        hit += int(table[labels[inside]].sum())
        total += labels.numel()
    return hit / total if total else 0.0


def to_draft_labels(labels: torch.Tensor, draft_ids: torch.Tensor, vocab_size: int, ignore: int = -100) -> torch.Tensor:
    """Map target ids to draft-vocabulary rows; ids outside it become ``ignore``."""
    table = torch.full((vocab_size,), ignore, dtype=torch.long)
    table[draft_ids] = torch.arange(draft_ids.numel())
    return table[labels]
