"""MedusaHeads: the weights of K Medusa heads and the one piece of maths they do.

Head k is ``L`` residual blocks followed by a vocabulary projection (Cai et al., 2024)::

    x = h
    for j in range(L):
        x = x + silu(W[k, j] @ x + b[k, j])
    logits_k = W_out[k] @ x

``h`` is the target's last post-norm hidden state at position t (the row whose own logits
predict the token at t+1); head k predicts the token at t+k+2. All K heads run as one batched
einsum, so a proposal costs one small pass whatever K is.
"""

from __future__ import annotations

import torch

__all__ = ["MedusaHeads"]


class MedusaHeads:
    """K heads of L residual blocks each, over hidden size H and vocabulary V.

    ``res_weight`` [K, L, H, H] (each block's [out, in] matrix), ``res_bias`` [K, L, H],
    ``out_weight`` [K, V, H]. Immutable by convention: ``to`` returns a copy.
    """

    def __init__(self, res_weight: torch.Tensor, res_bias: torch.Tensor, out_weight: torch.Tensor):
        if res_weight.dim() != 4 or res_weight.shape[-1] != res_weight.shape[-2]:
            raise ValueError(f"res_weight must be [K, L, H, H], got {list(res_weight.shape)}")
        k, layers, hidden, _ = res_weight.shape
        if tuple(res_bias.shape) != (k, layers, hidden):
            raise ValueError(f"res_bias must be {[k, layers, hidden]}, got {list(res_bias.shape)}")
        if out_weight.dim() != 3 or out_weight.shape[0] != k or out_weight.shape[2] != hidden:
            raise ValueError(f"out_weight must be [{k}, V, {hidden}], got {list(out_weight.shape)}")
        if k < 1:
            raise ValueError("a Medusa file needs at least one head")
        self.res_weight = res_weight  # [K, L, H, H]
        self.res_bias = res_bias  # [K, L, H]
        self.out_weight = out_weight  # [K, V, H]

    # -- shape facts ------------------------------------------------------------------------
    @property
    def head_count(self) -> int:
        return int(self.res_weight.shape[0])

    @property
    def layers_per_head(self) -> int:
        return int(self.res_weight.shape[1])

    @property
    def hidden_size(self) -> int:
        return int(self.res_weight.shape[2])

    @property
    def vocab_size(self) -> int:
        return int(self.out_weight.shape[1])

    @property
    def device(self) -> torch.device:
        return self.out_weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.out_weight.dtype

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "MedusaHeads":
        """A copy on ``device`` / in ``dtype`` (self when nothing changes)."""
        moved = [t.to(device=device, dtype=dtype) for t in (self.res_weight, self.res_bias, self.out_weight)]
        if all(a is b for a, b in zip(moved, (self.res_weight, self.res_bias, self.out_weight))):
            return self
        return MedusaHeads(*moved)

    # -- the maths --------------------------------------------------------------------------
    def logits(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """Logits of the first ``heads`` heads (all by default) for hidden rows.

        hidden: [H] or [N, H]. Returns [heads, V] or [N, heads, V] in the heads' dtype.
        """
        n = self.head_count if heads is None else max(0, min(int(heads), self.head_count))
        if hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden rows have width {hidden.shape[-1]}, the heads expect {self.hidden_size}")
        h = hidden.to(device=self.device, dtype=self.dtype)
        x = h.unsqueeze(-2).expand(*h.shape[:-1], n, self.hidden_size)  # [..., n, H]
        for j in range(self.layers_per_head):
            w = self.res_weight[:n, j]  # [n, H, H]
            b = self.res_bias[:n, j]  # [n, H]
            x = x + torch.nn.functional.silu(torch.einsum("koi,...ki->...ko", w, x) + b)
        return torch.einsum("kvh,...kh->...kv", self.out_weight[:n], x)  # [..., n, V]
