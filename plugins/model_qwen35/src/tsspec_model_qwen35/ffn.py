"""Feed-forward blocks: Qwen 3.5's dense SwiGLU and the MoE of Qwen 3.5-MoE / Qwen3-Next.

MoE routing: softmax over all experts (in float32), top-k, renormalised to sum to 1 (when
``norm_top_k``), SwiGLU experts; plus a shared SwiGLU expert scaled per token by
``sigmoid(ffn_gate_inp_shexp x)``. Experts run per expert over the rows routed to it, so a
one-row step touches only its k experts' weights.
"""

from __future__ import annotations

import attrs
import torch

from .ops import exact_rows, linear, rowwise, swiglu


@attrs.define
class DenseFFN:
    gate: torch.Tensor  # [F, H]
    up: torch.Tensor  # [F, H]
    down: torch.Tensor  # [H, F]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [rows, H] -> [rows, H]
        return swiglu(x, self.gate, self.up, self.down)


@attrs.define
class MoEFFN:
    router: torch.Tensor  # [E, H]
    gate_exps: torch.Tensor  # [E, F, H]
    up_exps: torch.Tensor  # [E, F, H]
    down_exps: torch.Tensor  # [E, H, F]
    top_k: int
    norm_top_k: bool
    shared: DenseFFN | None = None
    shared_gate: torch.Tensor | None = None  # [H]: one logit per token

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [rows, k] in x's dtype, expert ids [rows, k])."""
        logits = linear(x, self.router).to(torch.promote_types(x.dtype, torch.float32))  # [rows, E]
        probs = rowwise(lambda r: torch.softmax(r, dim=-1), logits, exact_rows(self.router))
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_top_k:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(x.dtype), ids

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [rows, H] -> [rows, H]
        weights, ids = self.route(x)
        out = torch.zeros_like(x)
        for expert in torch.unique(ids).tolist():
            rows, slot = torch.nonzero(ids == expert, as_tuple=True)
            y = swiglu(x[rows], self.gate_exps[expert], self.up_exps[expert], self.down_exps[expert])
            out[rows] += y * weights[rows, slot, None]  # a row picks an expert at most once
        if self.shared is not None:
            gate = x @ self.shared_gate if isinstance(self.shared_gate, torch.Tensor) else self.shared_gate(x)[:, 0]
            scale = rowwise(torch.sigmoid, gate, exact_rows(self.router))[:, None]  # [rows, 1]
            out = out + self.shared(x) * scale
        return out
