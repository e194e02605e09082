"""Batch invariance of the float32 CPU path: a row's result does not depend on how many rows
share the forward, so a k-row verify reproduces the one-row decode bit for bit.

torch's float32 GEMMs pick kernels (and summation orders) by row count, and its vectorised
elementwise transcendental ops and reductions (softplus, sigmoid, softmax, exp, rsqrt, cos, sum)
take a vector or a scalar-tail path depending on how many elements share the tensor. So on the
float32 path:

* ``linear`` multiplies on ``tsspec_gguf.qlinear.BlockMatrix`` (the compiled kernel that sums
  every output in a fixed order whatever the row count; dense float32 weights ride it as format
  32, built once per weight and kept on the tensor), or, where the kernel cannot take the matrix
  (no compiled kernels, K not a multiple of 32), one row at a time;
* ``norm_rows`` and ``silu_mul_rows`` run RMSNorm and the SiLU product on the compiled per-row
  kernels of ``tsspec_gguf.rowops``;
* ``per_row`` applies a function to each row on its own: a fresh contiguous tensor of exactly the
  one-row shape, so every row runs the code a one-row decode runs (the other transcendental ops,
  and everything when the compiled kernels are missing).

float64 (the exact reference mode) runs batched, as torch gives it.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F

from tsspec_gguf import native, rowops
from tsspec_gguf.qlinear import QK, BlockMatrix

_BLOCK_ATTR = "_tsspec_row_block"  # the weight's BlockMatrix (or None), kept on the tensor
_SLICES_ATTR = "_tsspec_row_slices"  # per-slice BlockMatrices of a stacked [E, N, K] weight


def row_invariant(t: torch.Tensor) -> bool:
    """Whether tensors of this dtype take the batch-invariant path (float32 on the CPU)."""
    return t.dtype == torch.float32 and t.device.type == "cpu"


def _block_for(weight: torch.Tensor) -> BlockMatrix | None:
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.shape[1] % QK or not native.available():
        return None
    return BlockMatrix.dense(weight)


def block_of(weight: torch.Tensor) -> BlockMatrix | None:
    """The weight [N, K] as a format-32 BlockMatrix, built on first use and kept on the tensor
    (None where the kernel cannot take it)."""
    if not hasattr(weight, _BLOCK_ATTR):
        setattr(weight, _BLOCK_ATTR, _block_for(weight))
    return getattr(weight, _BLOCK_ATTR)


def block_of_slice(stacked: torch.Tensor, index: int, parts: int | None = None
                   ) -> tuple[torch.Tensor, BlockMatrix | None]:
    """(slice, its BlockMatrix) of a stacked weight, kept on the stack: ``stacked[index]`` of an
    [E, N, K] weight (the experts), or with ``parts`` the index-th of ``parts`` equal row blocks of
    an [parts * N, K] weight (the grouped output projection)."""
    blocks = getattr(stacked, _SLICES_ATTR, None)
    if blocks is None:
        blocks = [None] * (parts or stacked.shape[0])
        setattr(stacked, _SLICES_ATTR, blocks)
    if blocks[index] is None:
        piece = stacked[index] if parts is None else stacked.chunk(parts)[index].contiguous()
        blocks[index] = (piece, _block_for(piece))
    return blocks[index]


def per_row(fn: Callable, *tensors: torch.Tensor):
    """``fn(*tensors)`` with every tensor split along dim 0, each row a fresh contiguous
    [1, ...] tensor, the outputs (a tensor or a tuple of tensors) concatenated. Batched as is
    unless the first tensor is on the float32 path."""
    if not row_invariant(tensors[0]):
        return fn(*tensors)
    outs = [fn(*(t[i : i + 1].clone() for t in tensors)) for i in range(tensors[0].shape[0])]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outs))
    return torch.cat(outs)


def _linear_rows(x: torch.Tensor, weight: torch.Tensor, block: BlockMatrix | None) -> torch.Tensor:
    if block is not None:
        return block.linear(x)
    return per_row(lambda row: F.linear(row, weight), x)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight^T``; x [rows, K] -> [rows, N], row-invariant on the float32 path."""
    if not row_invariant(x) or weight.dtype != torch.float32:
        return F.linear(x, weight)
    return _linear_rows(x, weight, block_of(weight))


def linear_slice(x: torch.Tensor, stacked: torch.Tensor, index: int, parts: int | None = None) -> torch.Tensor:
    """``x @ piece^T`` for a piece of a stacked weight (``block_of_slice``), row-invariant."""
    if not row_invariant(x) or stacked.dtype != torch.float32:
        return F.linear(x, stacked[index] if parts is None else stacked.chunk(parts)[index])
    weight, block = block_of_slice(stacked, index, parts)
    return _linear_rows(x, weight, block)


@functools.lru_cache(maxsize=16)
def _ones(n: int) -> torch.Tensor:
    return torch.ones(n)


def norm_rows(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor | None:
    """RMSNorm over the last dim on the compiled per-row kernel (``tsspec_gguf.rowops``: every
    row computed the same way whatever the row count), ``weight`` None for the unit norm; None
    where the kernel is not there or x is not on the float32 path (then the caller goes one row
    at a time or batched)."""
    if not row_invariant(x) or not native.available():
        return None
    n = x.shape[-1]
    w = _ones(n) if weight is None else weight.to(torch.float32).contiguous()
    return rowops.rms_norm(x.reshape(-1, n).contiguous(), w, eps).view(x.shape)


def silu_mul_rows(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
    """``silu(g) * u`` [rows, F] on the compiled per-row kernel; None where it is not there."""
    if not row_invariant(g) or not native.available():
        return None
    return rowops.silu_mul(torch.cat([g, u], dim=-1).contiguous())
