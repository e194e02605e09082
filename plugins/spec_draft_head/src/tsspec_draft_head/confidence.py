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
    fast = _native_gate(logits, top_k)
    if fast is not None:
        return fast
    return top1_over_topk_torch(logits, top_k)


def top1_over_topk_torch(logits: torch.Tensor, top_k: int = GATE_TOP_K) -> tuple[int, float]:
    """``top1_over_topk`` in torch ops: the reference, and the path for what the native gate
    leaves (another dtype or device, a NaN, a maximum that is not finite)."""
    # top-k in the logits' own float type (the cast to float64 is exact and keeps the order, so
    # this is the same set as on float64 logits without copying a vocabulary-sized vector)
    source = logits if logits.dtype in (torch.float32, torch.float64) else logits.to(torch.float64)
    values = torch.topk(source, min(top_k, logits.shape[0])).values.to(torch.float64)  # [k], descending
    probs = torch.softmax(values, dim=0)  # [k]
    return int(torch.argmax(logits).item()), float(probs[0].item())


def _native_gate(logits: torch.Tensor, top_k: int):
    """The gate in one kernel call (``top1_topk``) for a contiguous float32 CPU vector: the same
    argmax (the first maximum) and top-k set; the probability summed in float64 in another
    order than torch's softmax (equal within ~1e-15). None: the caller takes the torch path."""
    if (logits.dtype != torch.float32 or logits.device.type != "cpu" or not logits.is_contiguous()
            or not 1 <= top_k <= 64):
        return None
    kernels = _kernels()
    if kernels is None:
        return None
    return kernels.top1_topk(logits.data_ptr(), logits.shape[0], top_k)


def _kernels():
    """The compiled kernels with ``top1_topk``, or None (looked up once)."""
    global _KERNELS
    if _KERNELS is _UNSET:
        from tsspec_gguf import native

        k = native.kernels()
        _KERNELS = k if k is not None and hasattr(k, "top1_topk") else None
    return _KERNELS


_UNSET = object()
_KERNELS = _UNSET


def passes_gate(probability: float, min_draft_prob: float) -> bool:
    """Draft a token only when the head's top-1 probability reaches ``min_draft_prob``.

    pmin 0 always passes (the window is the only limit); pmin 1 passes only a saturated head.
    A NaN probability (a broken head) never passes.
    """
    return probability >= min_draft_prob
