"""Random weights for the scripts' tiny transformers DeepSeek V4 models (transformers' own init
zeroes the sinks, biases and hash table, which would hide the paths the scripts measure)."""

from __future__ import annotations

import math

import torch


@torch.no_grad()
def randomize(model: torch.nn.Module, generator: torch.Generator, *, experts: int,
              full_noise: tuple[str, ...] = ("embed",)) -> None:
    """Draw every parameter and buffer of ``model`` in a fixed order from ``generator``: norms and
    scales near 1, matrices scaled by 1/sqrt(fan-in), the hash table in ``[0, experts)``, names
    containing a ``full_noise`` word at unit scale, everything else at 0.3."""
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if "inv_freq" in name:
            continue
        noise = torch.randn(p.shape, generator=generator)
        if name.endswith("tid2eid"):
            p.copy_(torch.randint(0, experts, p.shape, generator=generator))
        elif "norm" in name and p.dim() == 1:
            p.copy_(1.0 + 0.3 * noise)
        elif name.endswith(".scale"):
            p.copy_(1.0 + 0.2 * noise)
        elif p.dim() >= 2 and "embed" not in name:
            p.copy_(noise / math.sqrt(p.shape[-1]))
        else:
            p.copy_(noise if any(word in name for word in full_noise) else 0.3 * noise)
