"""``tsspec train-drafter --kind mtp``: a NextN head trained by self-distillation.

Data comes from the shared core (``tsspec_training``): teacher-forcing rows and the target's
own argmax labels. The head is initialised from the target (its last decoder layer, final norm
and the LM-head rows of the draft vocabulary, when the file has llama.cpp's tensor names) and
trained with multi-step unrolling: step 1 reads the trunk's true rows, steps 2..k read the
head's own chained output (``NextNModule.unrolled``), with the attention mask the chain sees at
drafting time, so acceptance holds up past the first token. The loss at step j is weighted
``0.8 ** (j - 1)``; ``kl_weight`` > 0 adds a soft cross-entropy on the target's top-k logits
(``ce_weight`` 0 with it: soft labels alone); ``confident_weight`` g > 0 weighs each position by
the target's top-1 probability to the power g (among its top-k logits), toward the tokens the
target is sure of, where a confident head's drafts pass the gate and land;
``layer_lr_scale`` lets the copied decoder layer learn at that fraction of the rate of the new
input projection and norms; ``init_layer`` chooses which target layer is copied.
``answer_share`` weights batches toward the target's own chat answers (what the head serves);
``restart_share`` cuts sequences at random rows (the head's cache restarting, as after
serving's bounded catch-up). Held-out prompts are scored on their answer tokens too
(``answer_accuracy``): the drafts serving makes, without the easy chat-template rows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import attrs
import torch
import torch.nn.functional as F

from tsspec_training import dataset as datasets
from tsspec_training import loop, vocab
from tsspec_training.request import TrainRequest
from tsspec_training.teacher import TeacherSequence

from .nextn_file import read_nextn, write_nextn
from .nextn_model import NextNConfig, NextNModule
from .speculator import DEFAULT_CATCH_UP_ROWS

KIND = "mtp"
DESCRIPTION = "NextN / MTP per-token head (EAGLE-style unrolled training), file architecture 'nextn'"
STEP_DECAY = 0.8
IGNORE = -100


def _config(target, draft_vocab: int, *, qk_norm: bool = False) -> NextNConfig:
    cfg, extra = target.config, target.config.extra
    heads = int(extra.get("num_heads") or max(1, cfg.hidden_size // 64))
    return NextNConfig(
        hidden_size=int(cfg.hidden_size),
        intermediate_size=int(extra.get("ffn_size") or 4 * cfg.hidden_size),
        num_heads=heads,
        num_kv_heads=int(extra.get("num_kv_heads") or heads),
        head_dim=int(extra.get("head_dim") or cfg.hidden_size // heads),
        rope_theta=float(extra.get("rope_theta") or 10000.0),
        rms_eps=float(extra.get("rms_norm_eps") or 1e-5),
        draft_vocab=int(draft_vocab),
        qk_norm=qk_norm,
    )


def _layer_index(num_layers: int, layer: int | None) -> int:
    return num_layers - 1 if layer is None else layer % num_layers


def _target_has_qk_norm(model_path: str, index: int) -> bool:
    """Whether the target's layer ``index`` (the one a head copies) has per-head q/k norms (a
    Qwen3 layer): the head's layer then has them too."""
    from tsspec_gguf.gguf_file import GGUFFile

    try:
        with GGUFFile(model_path) as f:
            return f.has_tensor(f"blk.{index}.attn_q_norm.weight")
    except Exception:  # not a GGUF (a file-less target): a plain llama layer
        return False


def head_is_target(init: str) -> bool:
    """Whether ``_initialise``'s summary says the head rows were copied from the target."""
    return init.startswith("target") and "head" in init.rsplit("(", 1)[-1].rstrip(")").split(", ")


LAYER = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")  # the decoder layer's matrices


def _initialise(module: NextNModule, model_path: str, num_layers: int, seed: int, *, from_target: bool,
                layer: int | None = None) -> str:
    """Random init, then the target's layer ``layer`` (None: the last; negative counts from the
    end) / final norm / head rows when readable."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("eh_proj", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "head"):
            p = getattr(module, name)
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 / math.sqrt(p.shape[1])))
        H = module.cfg.hidden_size
        # start as "mostly the trunk row": u = hnorm(h) + a little of the token
        module.eh_proj[:, H:] += torch.eye(H)
        if not from_target:
            return "random"
        from tsspec_gguf.gguf_file import GGUFFile

        index = _layer_index(num_layers, layer)
        last = f"blk.{index}."
        names = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
                 "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}
        if module.cfg.qk_norm:
            names.update(q_norm="attn_q_norm", k_norm="attn_k_norm")
        with GGUFFile(model_path) as f:
            copied = []
            for param, tname in names.items():
                full = last + tname + ".weight"
                p = getattr(module, param)
                if f.has_tensor(full) and tuple(f.tensor_shape(full)) == tuple(p.shape):
                    p.copy_(f.tensor(full))
                    copied.append(param)
            if f.has_tensor("output_norm.weight"):
                module.head_norm.copy_(f.tensor("output_norm.weight"))
            head_name = "output.weight" if f.has_tensor("output.weight") else "token_embd.weight"
            if f.has_tensor(head_name):
                module.head.copy_(f.tensor(head_name)[module.draft_ids])
                copied.append("head")
    which = "" if layer is None else f"layer {index}: "
    return f"target ({which}{', '.join(copied) or 'nothing matched'})"


def _draft_vocabulary(train: Sequence[TeacherSequence], vocab_size: int, k: int, answer_share: float,
                      always: Sequence[int]) -> torch.Tensor:
    """The FR-Spec draft vocabulary. ``answer_share`` > 0: the chat answers' labels make that
    share of the frequencies (the rest the corpus's), so the vocabulary covers what the head
    serves (on SmolLM2, 4,096 ids cover 88% of held-out answer tokens counted alike, 90-91%
    weighted; tsspec-drafters-smollm2's README); 0: every label alike."""
    answers = [s.labels for s in train if s.source == datasets.CHAT_SOURCE]
    rest = [s.labels for s in train if s.source != datasets.CHAT_SOURCE]
    if answer_share <= 0 or not answers or not rest:
        return vocab.draft_vocabulary((s.labels for s in train), vocab_size, k, always=always)
    counts = vocab.mixed_counts([(answers, answer_share), (rest, 1.0 - answer_share)], vocab_size)
    return vocab.top_ids(counts, k, always)


WARM = ("enorm", "hnorm", "eh_proj", "attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down",
        "head_norm")  # what a warm start takes from a trained drafter (the head rows follow the vocabulary)


def _warm_start(module: NextNModule, path: str) -> str:
    """Continue from a trained ``nextn`` drafter: its input projection, norms and decoder layer
    (the head rows stay the target's rows of THIS run's draft vocabulary, which may differ from
    the file's). OptionsError when the file is not a NextN drafter of this shape."""
    from tsspec.errors import ModelLoadError, OptionsError

    try:
        trained, _, _ = read_nextn(path)
    except (ModelLoadError, OSError) as exc:
        raise OptionsError(f"--init-from {path}: {exc}") from None
    if trained.cfg.hidden_size != module.cfg.hidden_size or any(
            getattr(trained, n).shape != getattr(module, n).shape for n in WARM):
        raise OptionsError(f"--init-from {path}: a drafter of another shape than this target's head")
    with torch.no_grad():
        for name in WARM:
            getattr(module, name).copy_(getattr(trained, name).float())
    return f"{path} ({', '.join(WARM)})"


def restarted(seq: TeacherSequence, row: int) -> TeacherSequence:
    """``seq`` from ``row - 1`` on: the head's context starts at ``row`` (it reads position 0 of
    the cut, ``row - 1``, only as the predecessor row of ``row``), its rows keep the trunk's
    full-context values. Positions shift by the same amount everywhere (RoPE is relative)."""
    cut = slice(row - 1, None)
    return TeacherSequence(
        source=seq.source, tokens=seq.tokens[cut], hidden=seq.hidden[cut], labels=seq.labels[cut],
        topk_ids=None if seq.topk_ids is None else seq.topk_ids[cut],
        topk_logits=None if seq.topk_logits is None else seq.topk_logits[cut],
        answer_start=max(0, seq.answer_start - (row - 1)),
    )


class _Batches:
    """Padded batches of teacher sequences, drawn with the loop's seeded generator.

    ``answer_share`` > 0: each sequence of a batch comes from the chat answers with that
    probability (else from the rest); ``restart_share`` > 0: each drawn sequence is cut to a
    random start row with that probability (``restarted``)."""

    MIN_ROWS_AFTER_RESTART = 16

    def __init__(self, data: Sequence[TeacherSequence], embed: torch.Tensor, draft_ids: torch.Tensor,
                 vocab_size: int, batch: int, device: torch.device, *, answer_share: float = 0.0,
                 restart_share: float = 0.0):
        self.data = list(data)
        self.embed = embed  # [V, H] float32 on device
        self.table = vocab.to_draft_labels(torch.arange(vocab_size), draft_ids, vocab_size, IGNORE)  # [V]
        self.batch = batch
        self.device = device
        self.answers = [s for s in self.data if s.source == datasets.CHAT_SOURCE]
        self.rest = [s for s in self.data if s.source != datasets.CHAT_SOURCE]
        # with no answers (or nothing else) there is nothing to weigh
        self.answer_share = answer_share if self.answers and self.rest else 0.0
        self.restart_share = restart_share

    def make(self, items: Sequence[TeacherSequence]):
        L = max(len(s.tokens) for s in items)
        B, H = len(items), items[0].hidden.shape[1]
        tokens = torch.zeros(B, L, dtype=torch.long)
        hidden = torch.zeros(B, L, H)
        labels = torch.full((B, L), IGNORE, dtype=torch.long)
        soft_ids = soft_logits = None
        if items[0].topk_ids is not None:
            k = items[0].topk_ids.shape[1]
            soft_ids = torch.full((B, L, k), IGNORE, dtype=torch.long)
            soft_logits = torch.full((B, L, k), float("-inf"))
        for b, s in enumerate(items):
            n = len(s.tokens)
            tokens[b, :n] = s.tokens
            hidden[b, :n] = s.hidden.float()
            labels[b, :n] = torch.where(s.labels >= 0, self.table[s.labels.clamp(min=0)], IGNORE)  # IGNORE stays
            if soft_ids is not None and s.topk_ids is not None:
                soft_ids[b, :n] = self.table[s.topk_ids]
                soft_logits[b, :n] = s.topk_logits.float()
        dev = self.device
        out = {"emb": self.embed[tokens.to(dev)], "hidden": hidden.to(dev), "labels": labels.to(dev)}
        if soft_ids is not None:
            out["soft_ids"], out["soft_logits"] = soft_ids.to(dev), soft_logits.to(dev)
        return out

    def sample(self, step: int, generator: torch.Generator):
        if not self.answer_share and not self.restart_share:
            picks = torch.randint(len(self.data), (self.batch,), generator=generator).tolist()
            return self.make([self.data[i] for i in picks])
        items = []
        for _ in range(self.batch):
            pool = self.data
            if self.answer_share:
                pool = self.answers if float(torch.rand((), generator=generator)) < self.answer_share else self.rest
            seq = pool[int(torch.randint(len(pool), (), generator=generator))]
            n = len(seq.tokens)
            if float(torch.rand((), generator=generator)) < self.restart_share and n > 2 * self.MIN_ROWS_AFTER_RESTART:
                seq = restarted(seq, int(torch.randint(2, n - self.MIN_ROWS_AFTER_RESTART, (), generator=generator)))
            items.append(seq)
        return self.make(items)


def confidence_weights(soft_logits: torch.Tensor, gamma: float) -> torch.Tensor:
    """[B, L] weights: the target's top-1 probability among its top-k logits, to the power
    ``gamma`` (rows without logits, the padding, weigh 0). soft_logits [B, L, k]."""
    top1 = torch.nan_to_num(torch.softmax(soft_logits.float(), dim=-1)[..., 0])  # [B, L]
    return top1.clamp(min=0.0) ** gamma


def _weighted_mean(values: torch.Tensor, weights: torch.Tensor | None, rows: torch.Tensor):
    """Mean of ``values`` over the ``rows`` that count, weighted when ``weights`` is given."""
    if not rows.any():
        return values.sum() * 0.0
    if weights is None:
        return values[rows].mean()
    w = weights[rows]
    return (values[rows] * w).sum() / w.sum().clamp(min=1e-8)


def _losses(module: NextNModule, batch, unroll: int, kl_weight: float, *, ce_weight: float = 1.0,
            confident_weight: float = 0.0):
    outs = module.unrolled(batch["emb"], batch["hidden"], unroll)
    labels = batch["labels"]  # [B, L] draft rows or IGNORE
    L = labels.shape[1]
    total = 0.0
    metrics: dict[str, float] = {}
    weight_sum = 0.0
    weights = None  # [B, L] per-position loss weights (None: every position alike)
    if confident_weight > 0 and "soft_logits" in batch:
        weights = confidence_weights(batch["soft_logits"], confident_weight)
    for j, out in enumerate(outs, start=1):
        logits = module.logits(out)  # [B, L, K]
        valid = torch.arange(L, device=labels.device)[None, :] >= max(1, j)  # the head never reads position 0
        target = torch.where(valid, labels, torch.full_like(labels, IGNORE))
        if weights is None:
            ce = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=IGNORE)
        else:
            per_row = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=IGNORE,
                                      reduction="none").view_as(target)  # [B, L]
            ce = _weighted_mean(per_row, weights, target != IGNORE)
        loss = ce if ce_weight == 1.0 else ce_weight * ce
        if kl_weight > 0 and "soft_ids" in batch:
            ids = batch["soft_ids"]  # [B, L, k]
            known = (ids != IGNORE) & valid[..., None]
            teacher = torch.softmax(batch["soft_logits"].masked_fill(~known, float("-inf")), dim=-1)
            teacher = torch.nan_to_num(teacher)  # rows with no known id
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids.clamp(min=0))  # [B, L, k]
            soft = -(teacher * logp.masked_fill(~known, 0.0)).sum(-1)  # [B, L]
            rows = known.any(-1)
            if weights is None:
                loss = loss + kl_weight * (soft[rows].mean() if rows.any() else 0.0)
            else:
                loss = loss + kl_weight * _weighted_mean(soft, weights, rows)
        w = STEP_DECAY ** (j - 1)
        total = total + w * loss
        weight_sum += w
        with torch.no_grad():
            counted = target != IGNORE
            hits = (logits.argmax(-1) == target) & counted
            # accuracy over every valid position (out-of-vocabulary labels count as misses)
            denom = (valid & (batch["hidden"].abs().sum(-1) > 0)).sum().clamp(min=1)
            metrics[f"acc{j}"] = float(hits.sum() / denom)
    return total / weight_sum, metrics


@torch.no_grad()
def evaluate(module: NextNModule, batches: _Batches, data: Sequence[TeacherSequence], unroll: int) -> dict[str, float]:
    """Per-step accuracy on ``data`` (teacher-forced chains; an estimate of acceptance)."""
    module.eval()
    sums: dict[str, float] = {}
    for i in range(0, len(data), batches.batch):
        batch = batches.make(data[i : i + batches.batch])
        _, metrics = _losses(module, batch, unroll, 0.0)
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + v * len(data[i : i + batches.batch])
    return {k: v / max(1, len(data)) for k, v in sums.items()}


@torch.no_grad()
def answer_accuracy(module: NextNModule, batches: _Batches, data: Sequence[TeacherSequence], unroll: int,
                    *, context_rows: int | None = None) -> dict[str, float]:
    """Per-step accuracy on the ANSWER tokens of prompt + answer sequences (``answer_start`` > 0),
    the drafts that serving makes: row q's draft counts from q = answer_start on (the target
    itself emits the first answer token after prefill). ``context_rows``: the head's context
    starts that many rows before the answer (serving's bounded catch-up shows it the prompt's
    last rows only); None: from the sequence's start."""
    module.eval()
    hits: dict[int, int] = {}
    total = 0
    for seq in data:
        start = seq.answer_start
        if start < 1 or start >= len(seq.tokens):
            continue
        if context_rows is not None and start - context_rows > 1:
            seq = restarted(seq, start - context_rows)
            start = seq.answer_start
        batch = batches.make([seq])
        labels = batch["labels"][0, start:]  # [n] draft rows or IGNORE (a miss)
        total += labels.numel()
        for j, out in enumerate(module.unrolled(batch["emb"], batch["hidden"], unroll), start=1):
            guess = module.logits(out[0, start:]).argmax(-1)  # [n]
            hits[j] = hits.get(j, 0) + int((guess == labels).sum())
    return {f"acc{j}": h / max(1, total) for j, h in sorted(hits.items())}


def _metrics(values: dict[str, float]) -> str:
    """``acc1=0.467 acc2=0.428``: a metrics dict for the log."""
    return " ".join(f"{k}={v:.3f}" for k, v in values.items())


def train_mtp(request: TrainRequest, target, log: Callable[[str], None] = print, progress=None) -> dict:
    """Train and write a ``nextn`` drafter for ``target``; returns a summary."""
    device = loop.resolve_device(request.loop.device)
    identity = request.identity.get("sha256") or request.identity.get("shape_digest", "")
    data, manifest = datasets.build(target, identity, request.data, progress=progress, log=log)
    train, valid = datasets.split(data, request.valid_share, request.data.seed)
    V = int(target.config.vocab_size)
    eos = sorted(getattr(getattr(target, "tokenizer", None), "eos_token_ids", ()) or ())
    vocab_share = request.vocab_answer_share
    draft_ids = _draft_vocabulary(train, V, request.draft_vocab, vocab_share, eos)
    cover = vocab.coverage((s.labels for s in valid or train), draft_ids)
    held_out = datasets.build_held_out(target, identity, request.data, request.held_out_prompts,
                                       progress=progress, log=log)
    answer_labels = [s.labels[s.answer_start:] for s in held_out if 0 < s.answer_start < len(s.tokens)]
    answer_cover = vocab.coverage(answer_labels, draft_ids) if answer_labels else None
    log(f"draft vocabulary: {draft_ids.numel()} tokens, covering {cover:.1%} of held-back teacher labels"
        + (f", {answer_cover:.1%} of held-out answer tokens" if answer_cover is not None else ""))
    num_layers = int(target.config.num_layers)
    qk_norm = request.init_from_target and _target_has_qk_norm(request.model_path,
                                                                _layer_index(num_layers, request.init_layer))
    cfg = _config(target, draft_ids.numel(), qk_norm=qk_norm)
    module = NextNModule(cfg, V)
    module.draft_ids.copy_(draft_ids)
    init = _initialise(module, request.model_path, num_layers, request.loop.seed,
                       from_target=request.init_from_target, layer=request.init_layer)
    # the whole vocabulary's rows, copied from the target and frozen, ARE the target's LM head:
    # the file then borrows it (no rows of its own; the speculators format's mtp head)
    shared_head = int(draft_ids.numel()) == V and head_is_target(init)
    if request.init_from:
        init = _warm_start(module, request.init_from) + f"; head rows: {init}"
    log(f"initialised from {init}")
    module.head.requires_grad_(False)  # the target's own rows: frozen (fewer weights to overfit)
    if request.freeze_layer:
        # keep the target's last layer as copied: only eh_proj and the norms learn (a small
        # corpus cannot overfit 0.7M weights the way it overfits 4M)
        for name in LAYER:
            getattr(module, name).requires_grad_(False)
    module.to(device)
    with torch.inference_mode():
        embed = target.embed(list(range(V))).float()  # [V, H]
    embed = embed.clone().to(device)
    batches = _Batches(train, embed, draft_ids, V, request.batch, device, answer_share=request.answer_share,
                       restart_share=request.restart_share)
    before = evaluate(module, batches, valid, request.unroll) if valid else {}
    held_before = evaluate(module, batches, held_out, request.unroll) if held_out else {}
    answers_before = answer_accuracy(module, batches, held_out, request.unroll) if held_out else {}
    spec = request.loop
    if request.layer_lr_scale != 1.0:
        spec = attrs.evolve(spec, lr_scales=tuple((name, float(request.layer_lr_scale)) for name in LAYER))
    history = loop.run(
        module, spec, batches.sample,
        lambda batch: _losses(module, batch, request.unroll, request.kl_weight, ce_weight=request.ce_weight,
                              confident_weight=request.confident_weight),
        log=log, progress=progress,
    )
    after = evaluate(module, batches, valid, request.unroll) if valid else {}
    held_after = evaluate(module, batches, held_out, request.unroll) if held_out else {}
    answers_after = answer_accuracy(module, batches, held_out, request.unroll) if held_out else {}
    answers_served = answer_accuracy(module, batches, held_out, request.unroll,
                                     context_rows=DEFAULT_CATCH_UP_ROWS) if held_out else {}
    log("validation accuracy per step: before " + _metrics(before)
        + " | after " + _metrics(after))
    if held_out:
        log(f"held-out answers ({len(held_out)} prompts, {sum(len(s.tokens) for s in held_out)} tokens) accuracy per "
            "step: before " + _metrics(held_before)
            + " | after " + _metrics(held_after))
        log("held-out answer tokens only: before " + _metrics(answers_before)
            + " | after " + _metrics(answers_after)
            + f" | after, head context from the prompt's last {DEFAULT_CATCH_UP_ROWS} rows "
            + _metrics(answers_served))
    module.cpu()
    recipe = {
        "kind": KIND, "steps": request.loop.steps, "lr": request.loop.lr, "batch": request.batch,
        "unroll": request.unroll, "draft_vocab": int(draft_ids.numel()), "kl_weight": request.kl_weight,
        "ce_weight": request.ce_weight, "confident_weight": request.confident_weight,
        "layer_lr_scale": request.layer_lr_scale, "init_layer": request.init_layer,
        "seed": request.loop.seed, "init": init, "freeze_layer": request.freeze_layer, "draft_vocab_coverage": round(cover, 4),
        "draft_vocab_answer_share": vocab_share, "draft_vocab_answer_coverage": None if answer_cover is None else round(answer_cover, 4),
        "valid_accuracy": {k: round(v, 4) for k, v in after.items()},
        "held_out_accuracy": {k: round(v, 4) for k, v in held_after.items()},
        "held_out_prompts": len(held_out),
        "held_out_answer_accuracy": {k: round(v, 4) for k, v in answers_after.items()},
        "held_out_answer_accuracy_served_context": {k: round(v, 4) for k, v in answers_served.items()},
        "answer_share": request.answer_share, "init_from": Path(request.init_from).name if request.init_from else None, "restart_share": request.restart_share, "warmup": request.loop.warmup,
    }
    facts = {**request.identity, "vocab_size": V, "architecture": target.config.architecture}
    write_nextn(request.out_path, module, target=facts, manifest={**manifest, "recipe": recipe}, outtype=request.outtype,
                recommended=request.recommended or None, shared_head=shared_head)
    log(f"wrote {request.out_path}")
    return {"path": request.out_path, "history": history, "before": before, "after": after, "recipe": recipe,
            "held_out_before": held_before, "held_out_after": held_after,
            "held_out_answers_before": answers_before, "held_out_answers_after": answers_after}
