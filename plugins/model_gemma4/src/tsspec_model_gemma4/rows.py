"""Row-invariant building blocks: every op gives row r of a k-row call exactly what a one-row
call on that row gives, so a k-row verify equals k one-row decodes bit for bit.

* ``Linear``: the file's matrix as a ``tsspec_gguf`` BlockMatrix on the compiled kernels (CPU
  float32, quantised blocks kept; row-invariant by construction), else dense weights multiplied
  one row at a time (float64 reference mode, a build without the kernels, or an inner dim the
  block kernels cannot take); ``torch.mv`` a row (a BLAS GEMM wakes its thread pool even for
  one row, which costs more than the product at these sizes).
* ``rms``: the toolkit's row kernel (float32), else torch one row at a time; ``rowwise``:
  transcendental element-wise ops one row at a time (a vectorised op may treat a row's tail
  differently depending on where it falls in a lane).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tsspec_gguf import native, rowops
from tsspec_gguf.qlinear import BlockMatrix, pack_tensors


def rowwise(fn, x: torch.Tensor) -> torch.Tensor:
    """fn applied to each row of x [rows, ...] separately."""
    if x.shape[0] == 1:
        return fn(x)
    return torch.cat([fn(x[r : r + 1]) for r in range(x.shape[0])])


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim (Gemma 4 stores plain ``w``; None: weightless), row by row:
    the toolkit's kernel on float32 (``tsspec_gguf.rowops``), else torch one row at a time."""
    n = x.shape[-1]
    if x.dtype == torch.float32 and native.available():
        w = weight if weight is not None else torch.ones(n)
        return rowops.rms_norm(x.reshape(-1, n).contiguous(), w.to(torch.float32).contiguous(), eps).reshape(x.shape)
    return rowwise(lambda r: F.rms_norm(r, (n,), weight, eps), x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (HF ``gelu_pytorch_tanh``), row by row."""
    return rowwise(lambda r: F.gelu(r, approximate="tanh"), x)


class Linear:
    """``x @ W^T`` for x [rows, in] -> [rows, out]; see the module docstring."""

    __slots__ = ("block", "dense", "shape")

    def __init__(self, gguf_file, names: list[str], dtype: torch.dtype, blocks: bool, *, dense=None):
        self.block: BlockMatrix | None = None
        self.dense: torch.Tensor | None = None
        if dense is None and blocks:
            self.block = pack_tensors(gguf_file, names)
        if self.block is None:
            if dense is None:
                parts = [gguf_file.tensor(name) for name in names]
                dense = parts[0] if len(parts) == 1 else torch.cat(parts)
            dense = dense.reshape(dense.shape[0], -1)
            if blocks and dense.shape[1] % 32 == 0:
                self.block = BlockMatrix.dense(dense)
            else:
                self.dense = dense.to(dtype).contiguous()
        self.shape = tuple(self.block.shape if self.block is not None else self.dense.shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.block is not None and native.available():
            return self.block.linear(x.to(torch.float32).contiguous())
        w = self.dense if self.dense is not None else self.block.dequantize()
        x = x.to(w.dtype)
        return torch.stack([torch.mv(w, r) for r in x.unbind(0)])  # one matrix-vector product a row

    def weight(self) -> torch.Tensor:
        """The dense [out, in] weights (float32 for a block matrix)."""
        return self.dense if self.dense is not None else self.block.dequantize()
