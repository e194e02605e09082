"""A small, seeded, resumable training loop shared by every drafter kind.

``run(module, spec, sample, loss, log)`` optimises ``module``'s trainable parameters with AdamW
(linear warm-up, cosine decay) for ``spec.steps`` steps; ``lr_scales`` (parameter name ->
factor) gives named parameters a rate that is that fraction of the schedule's. ``sample(step, generator)`` returns the
batch of a step from a generator seeded by ``(seed, step)``, so a resumed run draws exactly the
batches the uninterrupted one would have; ``loss(batch)`` returns ``(loss, metrics)``.

A checkpoint (module and optimiser state, step, history) is written every
``checkpoint_every`` steps and at the end, atomically; ``run`` resumes from it when present.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Callable

import attrs
import torch

__all__ = ["LoopSpec", "run", "resolve_device"]


@attrs.frozen
class LoopSpec:
    steps: int = 200
    lr: float = 1e-3
    warmup: int = 10
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "cpu"
    checkpoint: str | None = None
    checkpoint_every: int = 25
    log_every: int = 10
    grad_clip: float = 1.0
    # parameter name -> factor on the scheduled rate (absent: 1), e.g. a copied layer learning
    # slower than the new projection; part of the schedule a checkpoint must share
    lr_scales: tuple[tuple[str, float], ...] = ()


def resolve_device(name: str | None) -> torch.device:
    """``auto`` / None: cuda when present, else cpu."""
    if not name or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _lr_at(step: int, spec: LoopSpec) -> float:
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    span = max(1, spec.steps - spec.warmup)
    return spec.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - spec.warmup) / span)))


def _schedule(spec: LoopSpec) -> dict:
    """What a checkpoint must share with the run resuming it."""
    mine = {"steps": spec.steps, "lr": spec.lr, "warmup": spec.warmup, "seed": spec.seed,
            "weight_decay": spec.weight_decay}
    if spec.lr_scales:  # absent when unused, so checkpoints written before the field still match
        mine["lr_scales"] = [list(item) for item in spec.lr_scales]
    return mine


def _param_groups(module: torch.nn.Module, spec: LoopSpec) -> list[dict]:
    """The trainable parameters, one optimiser group per distinct rate factor (in first-seen
    order, so a checkpoint's groups line up with a resumed run's)."""
    scales = dict(spec.lr_scales)
    groups: dict[float, list[torch.nn.Parameter]] = {}
    for name, p in module.named_parameters():
        if p.requires_grad:
            groups.setdefault(float(scales.get(name, 1.0)), []).append(p)
    return [{"params": ps, "lr_scale": scale} for scale, ps in groups.items()]


def run(
    module: torch.nn.Module,
    spec: LoopSpec,
    sample: Callable[[int, torch.Generator], Any],
    loss: Callable[[Any], tuple[torch.Tensor, dict[str, float]]],
    *,
    log: Callable[[str], None] = print,
    progress: Callable[..., Any] | None = None,
) -> list[dict[str, float]]:
    """Train; returns the per-step history (loss and metrics)."""
    torch.manual_seed(spec.seed)
    groups = _param_groups(module, spec)
    params = [p for g in groups for p in g["params"]]
    optimiser = torch.optim.AdamW(groups, lr=spec.lr, weight_decay=spec.weight_decay)
    history: list[dict[str, float]] = []
    start = 0
    ckpt = Path(spec.checkpoint) if spec.checkpoint else None
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        mine = _schedule(spec)
        theirs = state.get("schedule", mine)
        if theirs != mine:
            from tsspec.errors import OptionsError

            keys = list(mine) + [k for k in theirs if k not in mine]
            diff = ", ".join(f"{k} {theirs.get(k)} vs {mine.get(k)}" for k in keys if theirs.get(k) != mine.get(k))
            raise OptionsError(f"checkpoint {ckpt} belongs to another schedule ({diff}): delete it or choose another")
        module.load_state_dict(state["module"])
        optimiser.load_state_dict(state["optimiser"])
        start, history = int(state["step"]), list(state["history"])
        log(f"resumed from {ckpt} at step {start}")

    def save(step: int) -> None:
        if ckpt is None:
            return
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        tmp = ckpt.with_suffix(ckpt.suffix + ".tmp")
        torch.save({"module": module.state_dict(), "optimiser": optimiser.state_dict(), "step": step,
                    "history": history, "schedule": _schedule(spec)}, tmp)
        os.replace(tmp, ckpt)

    steps = range(start, spec.steps)
    bar = progress(steps, total=spec.steps, initial=start, desc="train") if progress else steps
    began = time.perf_counter()
    module.train()
    for step in bar:
        generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + step)
        batch = sample(step, generator)
        for group in optimiser.param_groups:
            group["lr"] = _lr_at(step, spec) * group.get("lr_scale", 1.0)  # absent in older checkpoints
        value, metrics = loss(batch)
        optimiser.zero_grad(set_to_none=True)
        value.backward()
        if spec.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, spec.grad_clip)
        optimiser.step()
        record = {"step": step + 1, "loss": float(value.detach()), **metrics}
        history.append(record)
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{record['loss']:.3f}", refresh=False)
        if spec.log_every and (step + 1) % spec.log_every == 0:
            shown = " ".join(f"{k}={v:.3f}" for k, v in record.items() if k != "step")
            log(f"step {step + 1}/{spec.steps} {shown} ({time.perf_counter() - began:.0f}s)")
        if spec.checkpoint_every and (step + 1) % spec.checkpoint_every == 0:
            save(step + 1)
    save(spec.steps)
    module.eval()
    return history
