"""The host half of DFlash2's selector: read the compact lattice back and walk it in numpy.

The device writes candidates [n, k], ``first`` [k] and ``transitions`` [n-1, k, k]; that is all
that crosses to the host (``k + k*k*(n-1)`` floats and ``n*k`` ids instead of an [n, vocab]
block). The walk is the greedy one of ``tsspec_block.selector.walk_lattice``: each row takes its
best candidate given the previous choice, ties to the earlier (higher-logit) candidate, and its
confidence is the softmax of its k scores at the choice, in float64.
"""

from __future__ import annotations

import numpy as np

__all__ = ["readback", "walk_compact"]


def readback(candidates, first, transitions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Copy the three compact lattice tensors to host numpy arrays (one sync)."""
    return (np.asarray(candidates.cpu().numpy(), dtype=np.int64),
            np.asarray(first.cpu().numpy(), dtype=np.float64),
            np.asarray(transitions.cpu().numpy(), dtype=np.float64))


def walk_compact(candidates: np.ndarray, first: np.ndarray, transitions: np.ndarray) -> tuple[list[int], list[float]]:
    """Greedy walk over the compact lattice: (tokens, confidences), one per row."""
    rows = candidates.shape[0]
    tokens: list[int] = []
    confidences: list[float] = []
    choice = 0
    for row in range(rows):
        scores = np.asarray(first if row == 0 else transitions[row - 1, choice], dtype=np.float64)
        choice = int(np.argmax(scores))  # first maximum: the earlier candidate wins a tie
        shifted = np.exp(scores - scores.max())
        tokens.append(int(candidates[row, choice]))
        confidences.append(float(shifted[choice] / shifted.sum()))
    return tokens, confidences
