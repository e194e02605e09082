"""DSpark block drafter (placeholder until its module lands): a file whose MTP slots hold DSpark
stages is refused with a clear message instead of being served wrongly."""

from __future__ import annotations

from typing import Any

import torch

from tsspec.errors import ModelLoadError


def attach_embedded_dspark(target: Any, source: Any, dtype: torch.dtype) -> None:
    L = target.hp.num_layers
    if target.hp.nextn_layers and source.has_tensor(f"blk.{L}.dspark.fc.weight"):
        raise ModelLoadError(getattr(source, "path", "<memory>"), "DSpark stages are not supported yet")
