"""DeepSeek V4 MoE: routed experts (learned top-k or a frozen per-token hash) plus a shared expert.

Routing for a row x (``scoring`` is sqrt(softplus) on V4)::

    s       = score(W_router x)                                  # [E]
    experts = top_k(s + bias)            (learned layers)
            = tid2eid[token]             (hash layers: a frozen table per token id)
    w       = s[experts] / sum(s[experts]) * routed_scale
    out     = sum_e w_e * SwiGLU_e(x) + SwiGLU_shared(x)

Every SwiGLU clamps: the gate pre-activation from above at ``limit``, the up projection to
``[-limit, limit]``. Experts run per expert over the rows routed to it.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from .ops import clamped_swiglu


def score(logits: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "sqrtsoftplus":
        return F.softplus(logits).sqrt()
    if kind == "sigmoid":
        return torch.sigmoid(logits)
    return torch.softmax(logits, dim=-1)


@attrs.define
class MoEWeights:
    router: torch.Tensor  # [E, H]
    gate_exps: torch.Tensor  # [E, F, H]
    up_exps: torch.Tensor  # [E, F, H]
    down_exps: torch.Tensor  # [E, H, F]
    shared_gate: torch.Tensor  # [Fs, H]
    shared_up: torch.Tensor  # [Fs, H]
    shared_down: torch.Tensor  # [H, Fs]
    bias: torch.Tensor | None = None  # [E] selection bias (learned layers)
    tid2eid: torch.Tensor | None = None  # [V, k] long (hash layers)


def route(w: MoEWeights, x: torch.Tensor, ids: torch.Tensor, *, top_k: int, scoring: str,
          routed_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [rows, k] in x's dtype, expert ids [rows, k])."""
    scores = score(F.linear(x, w.router), scoring)  # [rows, E]
    if w.tid2eid is not None:
        experts = w.tid2eid[ids]
    else:
        biased = scores + w.bias.to(scores.dtype) if w.bias is not None else scores
        experts = torch.topk(biased, top_k, dim=-1, sorted=False).indices
    chosen = scores.gather(1, experts)
    chosen = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20)
    return chosen * routed_scale, experts


def moe(w: MoEWeights, x: torch.Tensor, ids: torch.Tensor, *, top_k: int, scoring: str, routed_scale: float,
        limit: float) -> torch.Tensor:
    """x [rows, H] (normed), ids [rows] the rows' token ids -> [rows, H]."""
    weights, experts = route(w, x, ids, top_k=top_k, scoring=scoring, routed_scale=routed_scale)
    out = torch.zeros_like(x)
    for expert in torch.unique(experts).tolist():
        rows, slot = torch.nonzero(experts == expert, as_tuple=True)
        y = clamped_swiglu(x[rows], w.gate_exps[expert], w.up_exps[expert], w.down_exps[expert], limit)
        out.index_add_(0, rows, y * weights[rows, slot, None])
    return out + clamped_swiglu(x, w.shared_gate, w.shared_up, w.shared_down, limit)
