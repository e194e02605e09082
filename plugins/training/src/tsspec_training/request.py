"""What a drafter trainer receives, and how trainers are registered.

A plugin that owns a drafter kind implements ``tsspec_register_trainers(register)`` and calls
``register(kind, trainer, *, description="")`` with ``trainer(request, target, log) -> dict``
(a summary: file written, figures). ``tsspec train-drafter --kind KIND`` loads the target,
builds a ``TrainRequest`` from its flags and calls the trainer registered for KIND.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from tsspec.runtime.catalog import TrainerEntry

from .dataset import DataSpec
from .loop import LoopSpec

__all__ = ["TrainRequest", "TrainerEntry"]


@attrs.frozen
class TrainRequest:
    model_path: str
    out_path: str
    kind: str
    data: DataSpec = attrs.field(factory=DataSpec)
    loop: LoopSpec = attrs.field(factory=LoopSpec)
    identity: dict[str, Any] = attrs.field(factory=dict)  # architecture, shape_digest, sha256
    layers: int = 1
    block_size: int = 8
    taps: tuple[int, ...] | None = None
    draft_vocab: int = 4096
    unroll: int = 3
    batch: int = 8
    kl_weight: float = 0.0
    outtype: str = "f16"
    valid_share: float = 0.05
    init_from_target: bool = True
    # per-token heads: continue from this trained drafter file (its layer, projection and norms)
    init_from: str | None = None
    freeze_layer: bool = False  # per-token heads: train only the input projection and norms
    # per-token heads: the copied decoder layer's rate as a fraction of the schedule's (the input
    # projection and norms keep the full rate; 1: all alike)
    layer_lr_scale: float = 1.0
    # per-token heads: which target layer the head's decoder layer is copied from (None: the
    # last; negative counts from the end)
    init_layer: int | None = None
    # weight of the hard-label cross-entropy (the target's argmax); 0 with kl_weight > 0 trains
    # on the target's soft top-k distribution alone
    ce_weight: float = 1.0
    # per-token heads: g > 0 weighs each position's loss by the target's top-1 probability (among
    # its top-k logits) to the power g, toward the tokens the target is sure of (needs soft_k > 0)
    confident_weight: float = 0.0
    # acceptance check: the target's answers to held-out generated prompts (never trained on),
    # teacher-forced and scored before and after training (0: none)
    held_out_prompts: int = 0
    # per-token heads: the share of each batch drawn from the target's own chat answers (the
    # distribution the drafter serves; 0: every sequence equally likely, whatever its source)
    answer_share: float = 0.0
    # per-token heads: the chat answers' share of the label counts that choose the draft
    # vocabulary (0: every label alike; ``answer_share`` counts them as the batches draw them)
    vocab_answer_share: float = 0.0
    # per-token heads: the share of sampled sequences cut to start at a random row, so the head
    # also learns to draft from a KV cache that restarts there (as serving's bounded catch-up
    # restarts it); the trunk rows keep their full context
    restart_share: float = 0.0
    # settings written into the drafter for the algorithm that serves it (pmin, draft_max)
    recommended: dict[str, Any] = attrs.field(factory=dict)

