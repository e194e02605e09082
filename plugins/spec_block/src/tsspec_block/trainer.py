"""``tsspec train-drafter --kind dflash``: a DFlash block drafter trained by self-distillation.

Data comes from the shared core (``tsspec_training``): the target's tapped residuals of every
position of teacher-forced sequences and its own argmax labels (``--taps``; default: three
layers spread over the depth, ``blocks.default_taps``). The objective is DFlash's block
diffusion: anchors drawn in each sequence, the block ``[anchor, MASK x (B-1)]`` conditioned on
the context's tapped rows, block row ``i`` trained toward the TARGET's argmax at position
``anchor + i`` (``blocks.block_labels``), cross-entropy over the draft vocabulary (FR-Spec,
``--draft-vocab K``), rows weighted ``exp(-(i-1)/gamma)`` (``gamma = (B-1)/2``: an early miss
ends the block).

Initialisation: ``fc`` maps each tap near-evenly (``1/taps`` identity per tap plus noise), the
decoder layers copy the target's last ``--layers`` layers where the target's GGUF has llama.cpp's
tensor names (q/k norms start at one), the LM head is the target's rows of the draft vocabulary
(frozen), the embedding is the target's (read at run time, not stored). The mask token is the
token the data uses least (``blocks.least_used_token``).

The file written is the existing ``dflash`` layout plus ``dflash.draft_vocab`` and the K head
rows (``output.weight``), with the corpus manifest and the recipe in ``tsspec.training.manifest``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs
import torch
import torch.nn.functional as F

from tsspec.errors import OptionsError
from tsspec_training import blocks, loop, vocab
from tsspec_training import dataset as datasets
from tsspec_training.request import TrainRequest
from tsspec_training.teacher import TeacherSequence

from .config import DFlashConfig
from .trainable import LAYER_PARAMS, BlockDrafterModule, init_uniform, write_trained_dflash

KIND = "dflash"
DESCRIPTION = "DFlash block drafter (block-diffusion objective), file architecture 'dflash'"
IGNORE = blocks.IGNORE


def drafter_config(target, request: TrainRequest, taps: Sequence[int], draft_ids: torch.Tensor,
                   mask_token_id: int) -> DFlashConfig:
    """The drafter's shape: the target's width, heads and FFN, ``request.layers`` layers."""
    cfg, extra = target.config, target.config.extra
    heads = int(extra.get("num_heads") or max(1, cfg.hidden_size // 64))
    head_dim = int(extra.get("head_dim") or cfg.hidden_size // heads)
    return DFlashConfig(
        num_layers=int(request.layers),
        hidden_size=int(cfg.hidden_size),
        ffn_size=int(extra.get("ffn_size") or 4 * cfg.hidden_size),
        n_head=heads,
        n_head_kv=int(extra.get("num_kv_heads") or heads),
        head_dim=head_dim,
        value_dim=head_dim,
        rope_base=float(extra.get("rope_theta") or 10000.0),
        eps=float(extra.get("rms_norm_eps") or 1e-6),
        block_size=int(request.block_size),
        target_layers=tuple(int(t) for t in taps),
        target_hidden_size=int(cfg.hidden_size),
        mask_token_id=int(mask_token_id),
        vocab_size=int(cfg.vocab_size),
        draft_vocab=tuple(int(i) for i in draft_ids.tolist()),
    )


def _target_tensors(model_path: str) -> "Callable[[str], torch.Tensor | None]":
    """A reader of the target GGUF's tensors by name (None when absent or unreadable)."""
    try:
        from tsspec_gguf.gguf_file import GGUFFile

        handle = GGUFFile(model_path)
    except Exception:  # a file-less target (toy) or a format the core cannot read
        return lambda name: None

    def read(name: str):
        return handle.tensor(name).float() if handle.has_tensor(name) else None

    read.close = handle.close  # type: ignore[attr-defined]
    return read


def initialise(module: BlockDrafterModule, target, model_path: str, seed: int, *, from_target: bool) -> str:
    """Seeded init, then the target's layers and LM-head rows; returns what was copied."""
    cfg = module.cfg
    g = torch.Generator().manual_seed(seed)
    taps = len(cfg.target_layers)
    with torch.no_grad():
        init_uniform(module.fc, g, 0.1)
        eye = torch.eye(cfg.hidden_size) / taps
        module.fc.add_(torch.cat([eye] * taps, dim=1))  # start from the taps' mean
        for lw in module.layers:
            for name, (_, kind) in LAYER_PARAMS.items():
                if kind == "matrix":
                    init_uniform(getattr(lw, name), g)
        copied: list[str] = []
        read = _target_tensors(model_path) if from_target else (lambda name: None)
        try:
            first = int(target.config.num_layers) - cfg.num_layers
            for i, lw in enumerate(module.layers):
                source = max(0, first + i)
                for name, (gguf_name, _) in LAYER_PARAMS.items():
                    value = read(f"blk.{source}.{gguf_name}")
                    p = getattr(lw, name)
                    if value is not None and tuple(value.shape) == tuple(p.shape):
                        p.copy_(value)
                        copied.append(f"blk.{source}.{gguf_name}")
            head = read("output.weight")
            if head is None:
                head = read("token_embd.weight")
            if head is not None and head.shape[1] == cfg.hidden_size:
                module.head.copy_(head[module.draft_ids])
                copied.append("LM-head rows")
            else:  # the target's head seen through its surface: logits of unit rows are its columns
                probe = target.lm_head(torch.eye(cfg.hidden_size)).float()  # [H, V]
                module.head.copy_(probe.T[module.draft_ids])
                copied.append("LM-head rows (probed)")
        finally:
            getattr(read, "close", lambda: None)()
    return ", ".join(copied) if copied else "random"


class _Batches:
    def __init__(self, data: Sequence[TeacherSequence], table: torch.Tensor, block_size: int, batch: int,
                 anchors: int, device: torch.device):
        self.data, self.table = list(data), table  # table: [V] target id -> draft row or IGNORE
        self.block_size, self.batch, self.anchors, self.device = block_size, batch, anchors, device

    def make(self, items, generator):
        batch = blocks.make_batch(items, self.block_size, self.anchors, generator)
        labels = torch.where(batch.labels == IGNORE, batch.labels, self.table[batch.labels.clamp(min=0)])
        labels = torch.where(batch.anchor_ok[..., None], labels, torch.full_like(labels, IGNORE))
        # a label outside the draft vocabulary cannot be drafted: scored as a miss, not trained
        present = (batch.labels != IGNORE) & batch.anchor_ok[..., None]
        return attrs.evolve(batch, labels=labels).to(self.device), present.to(self.device)

    def sample(self, step: int, generator: torch.Generator):
        picks = torch.randint(len(self.data), (self.batch,), generator=generator).tolist()
        return self.make([self.data[i] for i in picks], generator)


def _loss(module: BlockDrafterModule, embed: torch.Tensor, weights: torch.Tensor, packed):
    batch, present = packed
    rows = module(batch.features, batch.tokens, batch.anchors, embed)  # [b, n, B, H]
    logits = module.logits(rows[:, :, 1:])  # [b, n, B-1, K]
    labels = batch.labels  # [b, n, B-1] draft rows or IGNORE
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), ignore_index=IGNORE, reduction="none")
    ce = ce.view(labels.shape)
    w = weights[None, None, :] * (labels != IGNORE)  # [b, n, B-1]
    loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
    with torch.no_grad():
        hits = (logits.argmax(-1) == labels) & (labels != IGNORE)
        metrics = {"acc1": float(hits[..., 0].sum() / present[..., 0].sum().clamp(min=1))}
    return loss, metrics


@torch.no_grad()
def evaluate(module: BlockDrafterModule, batches: _Batches, embed: torch.Tensor, data: Sequence[TeacherSequence]):
    """Per-row accuracy (acc1..acc{B-1}) and the mean accepted prefix (``accepted``) of greedy
    blocks at every anchor of ``data`` whose whole window is labelled: an estimate of
    acceptance (the context is teacher-forced)."""
    module.eval()
    hits_all, present_all = [], []
    for i in range(0, len(data), batches.batch):
        batch, present = batches.make(data[i : i + batches.batch], None)
        logits = module.logits(module(batch.features, batch.tokens, batch.anchors, embed)[:, :, 1:])
        hits = (logits.argmax(-1) == batch.labels) & (batch.labels != IGNORE)
        keep = present.all(-1)  # [b, n] anchors with a full window
        hits_all.append(hits[keep].cpu())
        present_all.append(keep.sum())
    if not hits_all:
        return {}
    hits = torch.cat(hits_all)  # [m, B-1]
    out = {f"acc{j + 1}": float(hits[:, j].float().mean()) for j in range(hits.shape[1])} if hits.numel() else {}
    out["accepted"] = blocks.expected_accepted(hits)
    return out


def train_dflash(request: TrainRequest, target, log: Callable[[str], None] = print, progress=None) -> dict:
    """Train and write a ``dflash`` drafter for ``target``; returns a summary."""
    ignored = [name for name, value, default in (
        ("--ce-weight", request.ce_weight, 1.0), ("--kl-weight", request.kl_weight, 0.0),
        ("--confident-weight", request.confident_weight, 0.0), ("--layer-lr-scale", request.layer_lr_scale, 1.0),
        ("--init-layer", request.init_layer, None)) if value != default]
    if ignored:
        raise OptionsError(f"{', '.join(ignored)}: options of the per-token head trainer (--kind mtp); "
                           "the block trainer's loss is the block-diffusion cross-entropy")
    if request.block_size < 2:
        raise OptionsError(f"--block-size must be at least 2 (anchor + one draft), got {request.block_size}")
    device = loop.resolve_device(request.loop.device)
    num_layers = int(target.config.num_layers)
    taps = tuple(request.taps or request.data.taps or blocks.default_taps(num_layers))
    bad = [t for t in taps if not 0 <= t <= num_layers]
    if bad:
        raise OptionsError(f"--taps {list(taps)}: layer {bad[0]} is outside 0..{num_layers} (the residual entering "
                         "a layer; the last is the final residual)")
    log(f"taps: {list(taps)} (the residual entering those target layers)")
    spec = attrs.evolve(request.data, taps=taps)
    identity = request.identity.get("sha256") or request.identity.get("shape_digest", "")
    data, manifest = datasets.build(target, identity, spec, progress=progress, log=log)
    train, valid = datasets.split(data, request.valid_share, spec.seed)
    V = int(target.config.vocab_size)
    eos = sorted(getattr(getattr(target, "tokenizer", None), "eos_token_ids", ()) or ())
    draft_ids = vocab.draft_vocabulary((s.labels for s in train), V, request.draft_vocab, always=eos)
    cover = vocab.coverage((s.labels for s in valid or train), draft_ids)
    log(f"draft vocabulary: {draft_ids.numel()} tokens, covering {cover:.1%} of held-back teacher labels")
    mask = blocks.least_used_token(data, V)
    cfg = drafter_config(target, request, taps, draft_ids, mask)
    module = BlockDrafterModule(cfg)
    init = initialise(module, target, request.model_path, request.loop.seed, from_target=request.init_from_target)
    log(f"mask token {mask}; initialised from {init}")
    module.to(device)
    with torch.inference_mode():
        embed = target.embed(list(range(V))).float()  # [V, H]
    embed = embed.clone().to(device)
    table = vocab.to_draft_labels(torch.arange(V), draft_ids, V, IGNORE)  # [V]
    seq_len = max(len(s.tokens) for s in data)
    anchors = max(1, seq_len // request.block_size)
    batches = _Batches(train, table, request.block_size, request.batch, anchors, device)
    gamma = max(1.0, (request.block_size - 1) / 2)
    weights = blocks.position_weights(request.block_size, gamma).to(device)
    before = evaluate(module, batches, embed, valid) if valid else {}
    history = loop.run(module, request.loop, batches.sample, lambda b: _loss(module, embed, weights, b),
                       log=log, progress=progress)
    after = evaluate(module, batches, embed, valid) if valid else {}

    def shown(m: dict) -> str:
        return " ".join(f"{k}={v:.3f}" for k, v in m.items())

    log(f"validation (teacher-forced blocks): before {shown(before)} | after {shown(after)}")
    module.cpu()
    recipe = {
        "kind": KIND, "steps": request.loop.steps, "lr": request.loop.lr, "batch": request.batch,
        "anchors_per_sequence": anchors, "block_size": request.block_size, "layers": request.layers,
        "taps": list(taps), "draft_vocab": int(draft_ids.numel()), "draft_vocab_coverage": round(cover, 4),
        "mask_token_id": mask, "position_decay_gamma": gamma, "seed": request.loop.seed, "init": init,
        "valid_sequences": len(valid), "valid": {k: round(v, 4) for k, v in after.items()},
        "valid_before": {k: round(v, 4) for k, v in before.items()},
    }
    facts = {**request.identity, "architecture": target.config.architecture}
    write_trained_dflash(request.out_path, module, target=facts, manifest={**manifest, "recipe": recipe},
                         outtype=request.outtype)
    log(f"wrote {request.out_path}")
    return {"path": request.out_path, "history": history, "before": before, "after": after, "recipe": recipe,
            "config": cfg, "module": module}
