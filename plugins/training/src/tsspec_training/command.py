"""``tsspec train-drafter``: train a learned drafter for a model by self-distillation.

The command is the core's; the training itself is the trainer a plugin registered for
``--kind`` (``tsspec_register_trainers``). An unknown kind is one line naming the installed ones
(exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tsspec.errors import OptionsError
from tsspec.cli.state import STATE

PANEL_DATA = "Data"
PANEL_TRAIN = "Training"


def _taps(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise OptionsError(f"--taps must be comma-separated layer ids, got {text!r}") from None


def train_drafter(
    kind: Annotated[str, typer.Option("--kind", help="Drafter kind (mtp, dflash...: see the error for installed ones).")],
    out: Annotated[str, typer.Option("--out", help="Drafter GGUF to write.")],
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Target GGUF, the teacher (default: the default model, the embedded smollm2-135m).")] = None,
    layers: Annotated[int, typer.Option("--layers", help="Drafter decoder layers.", rich_help_panel=PANEL_TRAIN)] = 1,
    block_size: Annotated[int, typer.Option("--block-size", help="Block drafters: tokens per block.", rich_help_panel=PANEL_TRAIN)] = 8,
    taps: Annotated[Optional[str], typer.Option("--taps", help="Block drafters and eagle3 heads: target layers to tap, e.g. 1,15,29 (eagle3 default: low, middle, top).", rich_help_panel=PANEL_TRAIN)] = None,
    draft_vocab: Annotated[int, typer.Option("--draft-vocab", help="Draft vocabulary size K (FR-Spec).", rich_help_panel=PANEL_TRAIN)] = 4096,
    steps: Annotated[int, typer.Option("--steps", help="Optimiser steps.", rich_help_panel=PANEL_TRAIN)] = 200,
    batch: Annotated[int, typer.Option("--batch", help="Sequences per step.", rich_help_panel=PANEL_TRAIN)] = 8,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.", rich_help_panel=PANEL_TRAIN)] = 1e-3,
    unroll: Annotated[int, typer.Option("--unroll", help="Per-token heads: chained steps trained (EAGLE-style).", rich_help_panel=PANEL_TRAIN)] = 3,
    freeze_layer: Annotated[bool, typer.Option("--freeze-layer/--train-layer", help="Per-token heads: keep the decoder layer copied from the target; train the input projection and norms only.", rich_help_panel=PANEL_TRAIN)] = False,
    init_from: Annotated[Optional[str], typer.Option("--init-from", help="Per-token heads: continue from a trained drafter file of this target (its decoder layer, input projection and norms; the head rows follow this run's draft vocabulary).", rich_help_panel=PANEL_TRAIN)] = None,
    answer_share: Annotated[float, typer.Option("--answer-share", help="Per-token heads: share of each batch drawn from the target's own chat answers (0: every sequence equally likely).", rich_help_panel=PANEL_TRAIN)] = 0.0,
    vocab_answer_share: Annotated[float, typer.Option("--vocab-answer-share", help="Per-token heads: the chat answers' share of the label counts that choose the draft vocabulary (0: every label alike; the --answer-share value counts them as the batches draw them).", rich_help_panel=PANEL_TRAIN)] = 0.0,
    restart_share: Annotated[float, typer.Option("--restart-share", help="Per-token heads: share of sampled sequences cut to a random start row (the head learns to draft from a cache that restarts, as after serving's bounded catch-up).", rich_help_panel=PANEL_TRAIN)] = 0.0,
    kl_weight: Annotated[float, typer.Option("--kl-weight", help="Weight of the soft (top-k KL) loss; 0: argmax labels only.", rich_help_panel=PANEL_TRAIN)] = 0.0,
    ce_weight: Annotated[float, typer.Option("--ce-weight", help="Weight of the hard-label (argmax) loss; 0 with --kl-weight > 0: the target's soft top-k labels alone.", rich_help_panel=PANEL_TRAIN)] = 1.0,
    confident_weight: Annotated[float, typer.Option("--confident-weight", help="Per-token heads: weigh each position by the target's top-1 probability (among its --soft-k logits) to this power, toward the tokens it is sure of (0: all alike).", rich_help_panel=PANEL_TRAIN)] = 0.0,
    layer_lr_scale: Annotated[float, typer.Option("--layer-lr-scale", help="Per-token heads: the copied decoder layer's learning rate as a fraction of the input projection's and norms' (1: all alike).", rich_help_panel=PANEL_TRAIN)] = 1.0,
    init_layer: Annotated[Optional[int], typer.Option("--init-layer", help="Per-token heads: the target layer the head's decoder layer is copied from (default: the last; negative counts from the end).", rich_help_panel=PANEL_TRAIN)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of data sampling and initialisation.", rich_help_panel=PANEL_TRAIN)] = 0,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch intra-op threads (default: torch's).", rich_help_panel=PANEL_TRAIN)] = None,
    device: Annotated[str, typer.Option("--device", help="auto (cuda when present), cpu or cuda (cuda is untested on a GPU).", rich_help_panel=PANEL_TRAIN)] = "auto",
    outtype: Annotated[str, typer.Option("--outtype", help="f32, f16 or q8_0.", rich_help_panel=PANEL_TRAIN)] = "f16",
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", help="Resumable checkpoint file (default: OUT.ckpt).", rich_help_panel=PANEL_TRAIN)] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per teacher-forcing sequence.", rich_help_panel=PANEL_DATA)] = 256,
    corpus_chars: Annotated[int, typer.Option("--corpus-chars", help="Characters per standard-library source.", rich_help_panel=PANEL_DATA)] = 6_000,
    package_chars: Annotated[int, typer.Option("--package-chars", help="Characters of installed packages docs.", rich_help_panel=PANEL_DATA)] = 4_000,
    prompts: Annotated[int, typer.Option("--prompts", help="Generated instruction prompts the target answers.", rich_help_panel=PANEL_DATA)] = 72,
    more_prompts: Annotated[int, typer.Option("--more-prompts", help="Further prompts answered on top of --prompts (the first --prompts and their cached teacher data kept as they are; only the new answers are made).", rich_help_panel=PANEL_DATA)] = 0,
    answer_tokens: Annotated[int, typer.Option("--answer-tokens", help="Longest cached answer.", rich_help_panel=PANEL_DATA)] = 96,
    soft_k: Annotated[int, typer.Option("--soft-k", help="Teacher top-k logits kept per row (for --kl-weight).", rich_help_panel=PANEL_DATA)] = 8,
    held_out: Annotated[int, typer.Option("--held-out-prompts", help="Held-out prompts answered and scored before and after training (acceptance check; never trained on).", rich_help_panel=PANEL_DATA)] = 0,
    recommend_pmin: Annotated[Optional[float], typer.Option("--recommend-pmin", help="Confidence gate written into the drafter for its algorithm (its figures' best).", rich_help_panel=PANEL_TRAIN)] = None,
    recommend_draft: Annotated[Optional[int], typer.Option("--recommend-draft", help="Longest chain written into the drafter for its algorithm.", rich_help_panel=PANEL_TRAIN)] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Linear warm-up steps before the cosine decay.", rich_help_panel=PANEL_TRAIN)] = 10,
    cache_dir: Annotated[Optional[str], typer.Option("--cache-dir", help="Teacher-data cache (default $TSSPEC_TRAIN_CACHE or ~/.cache/tsspec/training).", rich_help_panel=PANEL_DATA)] = None,
) -> None:
    """Train a drafter for MODEL by self-distillation (labels: the model's own predictions)."""
    from tsspec_gguf.identity import identify
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions
    from tsspec_training.dataset import DataSpec
    from tsspec_training.loop import LoopSpec
    from tsspec_training.request import TrainRequest

    catalog = STATE.catalog
    if threads is not None:
        if threads < 1:
            raise OptionsError(f"--threads must be at least 1, got {threads}")
        import torch

        torch.set_num_threads(threads)
    trainers = getattr(catalog, "trainers", {}) or {}
    if kind not in trainers:
        installed = ", ".join(sorted(trainers)) or "none"
        raise OptionsError(f"--kind {kind!r}: no installed plugin trains it (installed kinds: {installed})")
    if outtype not in ("f32", "f16", "q8_0"):
        raise OptionsError(f"--outtype must be f32, f16 or q8_0, got {outtype!r}")
    if recommend_pmin is not None and not 0.0 <= recommend_pmin <= 1.0:
        raise OptionsError(f"--recommend-pmin must be between 0 and 1, got {recommend_pmin}")
    if recommend_draft is not None and recommend_draft < 1:
        raise OptionsError(f"--recommend-draft must be at least 1, got {recommend_draft}")
    for name, value in (("--answer-share", answer_share), ("--restart-share", restart_share),
                        ("--vocab-answer-share", vocab_answer_share)):
        if not 0.0 <= value <= 1.0:
            raise OptionsError(f"{name} must be between 0 and 1, got {value}")
    if ce_weight < 0 or kl_weight < 0 or confident_weight < 0:
        raise OptionsError(f"--ce-weight, --kl-weight and --confident-weight must be at least 0, got {ce_weight}, "
                           f"{kl_weight} and {confident_weight}")
    if ce_weight == 0 and kl_weight == 0:
        raise OptionsError("--ce-weight 0 needs --kl-weight > 0: nothing would be learned")
    if ce_weight == 0 and soft_k < 1:
        raise OptionsError("--ce-weight 0 trains on the target's top-k logits alone: --soft-k must be at least 1")
    if confident_weight > 0 and soft_k < 1:
        raise OptionsError("--confident-weight reads the target's top-k logits: --soft-k must be at least 1")
    if not 0.0 < layer_lr_scale <= 10.0:
        raise OptionsError(f"--layer-lr-scale must be above 0 and at most 10, got {layer_lr_scale}")
    if init_from is not None and not Path(init_from).is_file():
        raise OptionsError(f"--init-from {init_from}: no such file")
    if held_out < 0 or warmup < 0 or more_prompts < 0:
        raise OptionsError(f"--held-out-prompts, --more-prompts and --warmup must be at least 0, got {held_out}, "
                           f"{more_prompts} and {warmup}")
    for name, value in (("--steps", steps), ("--batch", batch), ("--unroll", unroll), ("--draft-vocab", draft_vocab),
                        ("--seq-len", seq_len), ("--layers", layers), ("--block-size", block_size)):
        if value < 1:
            raise OptionsError(f"{name} must be at least 1, got {value}")
    if model is None:  # the default model a plugin offers, as a path (the drafter is keyed by it)
        from tsspec.runtime.named_models import default_model, resolve_model_path

        model = str(resolve_model_path(default_model(catalog), catalog))
    target = load_model(model, catalog=catalog, options=SpeculationOptions(enabled=False))
    n_layers = int(target.config.num_layers)
    if init_layer is not None and not -n_layers <= init_layer < n_layers:
        raise OptionsError(f"--init-layer {init_layer}: the target has {n_layers} layers (0..{n_layers - 1}, or -1..-{n_layers})")
    identity = identify(model).to_json() if not str(model).startswith("toy") else {
        "architecture": target.config.architecture, "shape_digest": "toy", "sha256": str(model)}
    request = TrainRequest(
        model_path=str(model), out_path=out, kind=kind,
        data=DataSpec(seq_len=seq_len, stdlib_chars=corpus_chars, package_chars=package_chars, prompts=prompts,
                      more_prompts=more_prompts, answer_tokens=answer_tokens, soft_k=soft_k, taps=_taps(taps), seed=seed,
                      cache_dir=cache_dir or ""),
        loop=LoopSpec(steps=steps, lr=lr, warmup=warmup, seed=seed, device=device, checkpoint=checkpoint or out + ".ckpt"),
        identity=identity, layers=layers, block_size=block_size, taps=_taps(taps), draft_vocab=draft_vocab,
        unroll=unroll, batch=batch, kl_weight=kl_weight, outtype=outtype, freeze_layer=freeze_layer, init_from=init_from,
        ce_weight=ce_weight, confident_weight=confident_weight, layer_lr_scale=layer_lr_scale, init_layer=init_layer,
        held_out_prompts=held_out, answer_share=answer_share, vocab_answer_share=vocab_answer_share, restart_share=restart_share,
        recommended={k: v for k, v in (("pmin", recommend_pmin), ("draft_max", recommend_draft)) if v is not None},
    )
    from tqdm.auto import tqdm

    def progress(it, **kw):
        return tqdm(it, mininterval=5, **kw)

    summary = trainers[kind].trainer(request, target, typer.echo, progress)
    typer.echo(f"drafter written: {summary.get('path', out)}")
