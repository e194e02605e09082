"""Row-invariant matmuls for a float32 CPU trunk, on the GGUF toolkit's compiled kernel.

torch's dense GEMM may sum a k-row call in another order than a one-row call, so a verify row
and the plain decode step at the same position can differ in the low bits (and, at a near-tie,
in the token). ``RowLinear`` keeps a float32 weight [N, K] as a format-32 ``BlockMatrix`` (the
weights as they are; d = 1, m = 0): the kernel sums every output row in one fixed order
whatever the row count, as the llama plugin's matrices do. K not divisible by 32 is padded with
zero columns (x too, per call): adding exact zeros leaves every sum unchanged.

``row_invariant_weights`` swaps the trunk's matrices for ``RowLinear``s (the MTP head keeps its
tensors: a drafter's rounding changes no emitted token). ``ops.linear`` multiplies either kind.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from tsspec_gguf import native
from tsspec_gguf.qlinear import QK, BlockMatrix

from .attention import AttentionWeights
from .deltanet import DeltaNetWeights
from .ffn import DenseFFN, MoEFFN


class RowLinear:
    """``x @ W^T`` for float32 CPU rows x [R, K] -> [R, N]; each row summed the same way
    whatever R is."""

    __slots__ = ("blocks", "pad", "shape")

    def __init__(self, weight: torch.Tensor):  # [N, K]
        if weight.dim() != 2 or weight.device.type != "cpu":
            raise ValueError("RowLinear takes a 2-D CPU weight")
        self.pad = (-weight.shape[1]) % QK
        padded = F.pad(weight.to(torch.float32), (0, self.pad)) if self.pad else weight
        self.blocks = BlockMatrix.dense(padded)
        self.shape = tuple(weight.shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad:
            x = F.pad(x, (0, self.pad))
        return self.blocks.linear(x.contiguous())


def available(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether a trunk in ``dtype`` on ``device`` can run its matrices on the kernel."""
    return dtype == torch.float32 and torch.device(device).type == "cpu" and native.available()


def _ffn(ffn: DenseFFN | MoEFFN) -> DenseFFN | MoEFFN:
    if isinstance(ffn, DenseFFN):
        return DenseFFN(RowLinear(ffn.gate), RowLinear(ffn.up), RowLinear(ffn.down))
    per_expert = lambda t: [RowLinear(t[e]) for e in range(t.shape[0])]  # noqa: E731
    return attrs.evolve(
        ffn, router=RowLinear(ffn.router), gate_exps=per_expert(ffn.gate_exps), up_exps=per_expert(ffn.up_exps),
        down_exps=per_expert(ffn.down_exps), shared=_ffn(ffn.shared) if ffn.shared is not None else None,
        shared_gate=RowLinear(ffn.shared_gate[None, :]) if ffn.shared_gate is not None else None,
    )


def _mixer(mixer: AttentionWeights | DeltaNetWeights) -> AttentionWeights | DeltaNetWeights:
    if isinstance(mixer, AttentionWeights):
        return attrs.evolve(mixer, q=RowLinear(mixer.q), k=RowLinear(mixer.k), v=RowLinear(mixer.v),
                            o=RowLinear(mixer.o))
    return attrs.evolve(mixer, in_proj=RowLinear(mixer.in_proj), out=RowLinear(mixer.out))


def row_invariant_weights(weights):
    """The same ``Qwen35Weights`` with every trunk matrix a ``RowLinear`` (no weight copied
    unless padded; the embedding and the MTP head keep their tensors)."""
    layers = [attrs.evolve(lw, mixer=_mixer(lw.mixer), ffn=_ffn(lw.ffn)) for lw in weights.layers]
    return attrs.evolve(weights, layers=layers, lm_head=RowLinear(weights.lm_head))
