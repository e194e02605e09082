"""The per-token confidence gate: top-1 probability over the head's top-k logits.

Why over the top-k and not the whole vocabulary: a trained head spreads a little mass over a
long tail of tokens; measuring the top-1 against only its nearest rivals makes the gate about
"is the head sure which of its candidates wins", and keeps it cheap (a top-k instead of a
softmax over 150k logits). ``--spec-pmin`` (default 0.75 for this algorithm) is the threshold.

Worked example: logits [2.0, 0.5, 0.0, -1.0], top_k 10 (all four): softmax gives
[0.7101, 0.1584, 0.0961, 0.0354]; top-1 is token 0 with 0.7101, under 0.75: the chain stops.
"""

from __future__ import annotations

import torch

GATE_TOP_K = 10  # the gate's candidate set: the head's top-10 logits


def top1_over_topk(logits: torch.Tensor, top_k: int = GATE_TOP_K) -> tuple[int, float]:
    """(argmax token, its softmax probability among the ``top_k`` largest logits).

    logits: [vocab]. Ties go to the lowest id (torch.topk on CPU is not specified on ties, so
    the argmax is taken separately from the probability).
    """
    if logits.dim() != 1 or logits.shape[0] == 0:
        raise ValueError(f"logits must be a non-empty [vocab] vector, got shape {tuple(logits.shape)}")
    # top-k in the logits' own float type (the cast to float64 is exact and keeps the order, so
    # this is the same set as on float64 logits without copying a vocabulary-sized vector)
    source = logits if logits.dtype in (torch.float32, torch.float64) else logits.to(torch.float64)
    values = torch.topk(source, min(top_k, logits.shape[0])).values.to(torch.float64)  # [k], descending
    probs = torch.softmax(values, dim=0)  # [k]
    return int(torch.argmax(logits).item()), float(probs[0].item())


def passes_gate(probability: float, min_draft_prob: float) -> bool:
    """Draft a token only when the head's top-1 probability reaches ``min_draft_prob``.

    pmin 0 always passes (the window is the only limit); pmin 1 passes only a saturated head.
    A NaN probability (a broken head) never passes.
    """
    return probability >= min_draft_prob
