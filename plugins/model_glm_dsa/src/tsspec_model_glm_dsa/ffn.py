"""GLM 5.x feed-forward blocks: the dense SwiGLU of the leading layers, and MoE with shared
experts after them.

Routing for a row x (``gating`` sigmoid on GLM 5)::

    s        = sigmoid(W_router x)                         # [E], in at least float32
    choice   = s + bias                                    # the selection bias (exp_probs_b)
    groups   = the ``groups_used`` best groups by the sum of their two best choices (one group: all)
    experts  = top_k(choice within those groups)
    w        = s[experts] (/ their sum when normalised) * routed_scale
    out      = sum_e w_e * SwiGLU_e(x) + SwiGLU_shared(x)

As transformers' ``GlmMoeDsaTopkRouter`` computes it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops import work_dtype
from .weights import FfnWeights


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def route(w: FfnWeights, x: torch.Tensor, *, top_k: int, gating: str, groups: int, groups_used: int,
          norm: bool, routed_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [rows, k] in x's dtype, expert ids [rows, k])."""
    wd = work_dtype(x.dtype)
    logits = F.linear(x.to(wd), w.router.to(wd))  # [rows, E]
    scores = torch.sigmoid(logits) if gating == "sigmoid" else torch.softmax(logits, dim=-1)
    choice = scores + w.bias.to(wd) if w.bias is not None else scores
    if groups > 1:
        rows, E = choice.shape
        best = choice.view(rows, groups, E // groups).topk(2, dim=-1).values.sum(-1)  # [rows, groups]
        keep = torch.zeros_like(best, dtype=torch.bool).scatter_(1, best.topk(groups_used, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(E // groups, dim=1), float("-inf"))
    experts = torch.topk(choice, top_k, dim=-1).indices  # [rows, k]
    weights = scores.gather(1, experts)
    if norm:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return (weights * routed_scale).to(x.dtype), experts


def ffn(w: FfnWeights, x: torch.Tensor, **routing) -> torch.Tensor:
    """x [rows, H] (normed) -> [rows, H]: dense SwiGLU, or MoE plus the shared experts."""
    shared = swiglu(x, w.gate, w.up, w.down)
    if w.router is None:
        return shared
    weights, experts = route(w, x, **routing)
    out = torch.zeros_like(x)
    for expert in torch.unique(experts).tolist():
        rows, slot = torch.nonzero(experts == expert, as_tuple=True)
        y = swiglu(x[rows], w.gate_exps[expert], w.up_exps[expert], w.down_exps[expert])
        out.index_add_(0, rows, y * weights[rows, slot, None])
    return out + shared
