"""DFlash2's candidate selector: a greedy walk through a low-rank lattice of top-k candidates.

Plain DFlash picks each block row's argmax independently, so row ``e+1`` never learns what row
``e`` chose: the weakness of block diffusion. The selector keeps the top-k candidates per row
and scores every (predecessor, candidate) pair through two low-rank ``[vocab, r]`` codebooks::

    score_e(c | prev) = u_e[c] + sum_r A[prev]_r * p_e,r * B[cand_e[c]]_r,   p_e = P h_e

``u_e`` are the row's top-k logits after the target's logit transform, ``A`` / ``B`` the
predecessor / successor codebooks, ``P`` the hidden projection. The walk starts from the
verified anchor token. The lattice (``k`` unary-plus-transition scores for row 0, a ``k x k``
transition matrix for every later row) is built in one batched op, which is all a device would
send back (``k + k*k*(rows-1)`` floats); the walk itself is sequential and tiny.

Worked example, k = 2: candidates ``[[5, 9], [3, 7]]``, anchor 1. Row 0 scores ``u_0 +
<A[1] * p_0, B[5|9]>``, say ``[2.0, 1.0]``: it takes 5 with confidence softmax([2, 1])[0] = 0.73;
row 1 then reads row 0 of its transition matrix (predecessor 5) plus ``u_1``.
"""

from __future__ import annotations

import attrs
import torch

__all__ = ["SelectorWeights", "selector_lattice", "walk_lattice", "select_tokens"]


@attrs.frozen
class SelectorWeights:
    """The three selector tensors, in numpy (``[out, in]``) order."""

    hidden: torch.Tensor  # [r, H]      P: drafter hidden -> rank space
    predecessor: torch.Tensor  # [vocab, r]  A: codebook of the previous token
    successor: torch.Tensor  # [vocab, r]    B: codebook of the candidate
    top_k: int

    @property
    def rank(self) -> int:
        return int(self.hidden.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.predecessor.shape[0])


def selector_lattice(
    weights: SelectorWeights,
    hidden: torch.Tensor,  # [n, H] final-normed drafter rows that predict the n drafts
    logits: torch.Tensor,  # [n, vocab] the target LM head's logits AFTER the logit transform
    anchor: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build the lattice: (candidates [n, k], first [k], transitions [n-1, k, k]).

    ``first[c]`` is row 0's full score given the anchor; ``transitions[e-1][i][c]`` is row e's
    full score (unary included) for candidate c after row e-1 chose its candidate i.
    """
    k = min(weights.top_k, logits.shape[-1])
    unary, candidates = torch.topk(logits, k, dim=-1)  # [n, k] each, best first
    proj = hidden.to(weights.hidden.dtype) @ weights.hidden.T  # [n, r]
    succ = weights.successor[candidates]  # [n, k, r]
    unary = unary.to(proj.dtype)
    first = unary[0] + succ[0] @ (weights.predecessor[anchor] * proj[0])  # [k]
    if candidates.shape[0] == 1:
        return candidates, first, proj.new_zeros((0, k, k))
    pred = weights.predecessor[candidates[:-1]] * proj[1:, None, :]  # [n-1, k_prev, r]
    transitions = unary[1:, None, :] + torch.einsum("epr,ecr->epc", pred, succ[1:])  # [n-1, k, k]
    return candidates, first, transitions


def walk_lattice(
    candidates: torch.Tensor, first: torch.Tensor, transitions: torch.Tensor
) -> tuple[list[int], list[float]]:
    """Greedy walk: each row takes its best candidate given the previous choice.

    Confidence of a row = softmax over its k scores at the chosen index. Ties go to the
    earlier (higher-logit) candidate.
    """
    cand = candidates.tolist()
    tokens: list[int] = []
    confidences: list[float] = []
    scores = first
    for row in range(len(cand)):
        if row > 0:
            scores = transitions[row - 1, choice]
        choice = int(torch.argmax(scores))
        tokens.append(int(cand[row][choice]))
        confidences.append(float(torch.softmax(scores.to(torch.float64), dim=-1)[choice]))
    return tokens, confidences


def select_tokens(
    weights: SelectorWeights, hidden: torch.Tensor, logits: torch.Tensor, anchor: int
) -> tuple[list[int], list[float]]:
    """Lattice then walk: the drafts and their confidences for ``hidden.shape[0]`` rows."""
    return walk_lattice(*selector_lattice(weights, hidden, logits, anchor))
