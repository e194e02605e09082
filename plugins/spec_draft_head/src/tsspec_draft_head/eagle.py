"""``tsspec train-drafter --kind eagle3``: an EAGLE-3-style head trained on the target's own answers.

What makes it EAGLE-3-style, beside the NextN head it extends (``NextNModule`` with
``feature_layers``):

* features: the residuals entering three target layers (low, middle, high:
  ``tsspec_training.onpolicy.feature_layers``) fused by ``fc`` [H, 3H]; the layer ids go in the
  file (``nextn.feature_layers``) and attaching sets the target's feature taps to them;
* data on policy: the target's greedy AND sampled answers to a prompt mix (``onpolicy``), made
  many sequences per forward on its paged path, the tapped rows kept as they are made (no second
  teacher pass); labels are the target's argmax at each answer row;
* training-time test: the head unrolled ``--unroll`` steps on its own outputs (``unrolled``);
* a draft vocabulary chosen from the answers' label frequencies.

``--init-from`` a trained ``nextn`` file warm-starts it: its layer, norms and projection, with
``fc`` reading the high tap through the target's output-norm weights (an RMS norm ignores the
scale, so the head starts as the file's head, drafting the same tokens) and the low and middle
taps at zero, for the training to open.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch

from tsspec_training import loop, vocab
from tsspec_training.onpolicy import (MIX_LICENSES, feature_layers, load_features, onpolicy_answers, prompt_mix,
                                      read_cache)
from tsspec_training.request import TrainRequest
from tsspec_training.teacher import TeacherSequence

from .nextn_file import read_nextn, write_nextn
from .nextn_model import NextNModule
from .speculator import DEFAULT_CATCH_UP_ROWS
from .trainer import (IGNORE, LAYER, _Batches, _config, _initialise, _losses, _metrics, _warm_start, answer_accuracy,
                      restarted)

KIND = "eagle3"
DESCRIPTION = "EAGLE-3-style per-token head: three fused target layers, on-policy answers (file architecture 'nextn')"
MODES = ("greedy", "sample-1")
VALID_SHARE = 0.1


def default_cache() -> Path:
    import os

    return Path(os.environ.get("TSSPEC_TRAIN_CACHE") or Path.home() / ".cache/tsspec") / "onpolicy-v1"


def sequences(records: Sequence[dict]) -> list[TeacherSequence]:
    """Training sequences of cached answers (``load_features`` records): tokens of prompt +
    answer but the last [P + n - 1], the tapped rows [P + n - 1, F], labels the target's
    argmax on answer rows (row P - 1 on) and IGNORE on the prompt's; the head's context starts
    ``DEFAULT_CATCH_UP_ROWS`` rows before the answer (``restarted``: what serving's bounded
    catch-up shows it at the first proposal, and fewer rows to train on)."""
    out = []
    for rec in records:
        P, n = len(rec["prompt_ids"]), len(rec["answer_ids"])
        if n < 2:
            continue
        tokens = torch.tensor(list(rec["prompt_ids"]) + list(rec["answer_ids"])[:-1], dtype=torch.long)
        labels = torch.full((P + n - 1,), IGNORE, dtype=torch.long)
        labels[P - 1:] = rec["argmax"]
        seq = TeacherSequence(source=f"{rec['class']}/{rec['mode']}", tokens=tokens, hidden=rec["hidden"],
                              labels=labels, answer_start=P)
        if P - DEFAULT_CATCH_UP_ROWS > 1:  # the head's context from the prompt's last rows, as serving shows it
            seq = restarted(seq, P - DEFAULT_CATCH_UP_ROWS)
        out.append(seq)
    return out


def _split(data: list[TeacherSequence], records: Sequence[dict], share: float) -> tuple[list, list]:
    """(train, valid): whole prompts held back (both modes of a prompt on one side)."""
    import hashlib

    train, valid = [], []
    for seq, rec in zip(data, records):
        digest = hashlib.sha256(("valid\x00" + rec["prompt"]).encode("utf-8")).digest()
        (valid if digest[0] < share * 256 else train).append(seq)
    return train, valid


def _prior_vocabulary(path: str | None) -> torch.Tensor | None:
    """The draft vocabulary of the warm-start file (None without one): the ranking of ids the
    on-policy answers do not count (a smaller corpus than the file's leaves many at zero)."""
    if not path:
        return None
    from tsspec.errors import ModelLoadError

    try:
        module, _, _ = read_nextn(path)
    except (ModelLoadError, OSError):
        return None  # _warm_start reports the bad file
    return module.draft_ids.clone()


def _fc_from_high_tap(module: NextNModule, model_path: str) -> None:
    """fc = [0 ... 0, diag(output_norm)]: the high tap (the final residual) scaled as the
    target's post-norm row is, the other taps off."""
    from tsspec_gguf.gguf_file import GGUFFile

    H = module.cfg.hidden_size
    with GGUFFile(model_path) as f:
        norm = f.tensor("output_norm.weight").float() if f.has_tensor("output_norm.weight") else torch.ones(H)
    with torch.no_grad():
        module.fc.zero_()
        high = len(module.cfg.feature_layers) - 1
        module.fc[:, high * H:(high + 1) * H] = torch.diag(norm)


def train_eagle3(request: TrainRequest, target, log: Callable[[str], None] = print, progress=None) -> dict:
    """Generate (or extend) the on-policy data, train and write the head; returns a summary."""
    import attrs

    device = loop.resolve_device(request.loop.device)
    L = int(target.config.num_layers)
    layers = tuple(request.taps) if request.taps else feature_layers(L)
    cache = Path(request.data.cache_dir) / "onpolicy-v1" if request.data.cache_dir else default_cache()
    mix = prompt_mix(request.data.prompts, request.data.seed)
    if request.data.sequences:  # given prompt ids (a target without a tokenizer): the target answers them
        mix = [{"class": "given", "system": "", "prompt": "ids:" + ",".join(map(str, seq)), "prompt_ids": list(seq)}
               for seq in request.data.sequences]
    records = onpolicy_answers(target, mix, cache, modes=MODES, max_new_tokens=request.data.answer_tokens,
                               batch=16, taps=layers, log=log)
    records = [r for r in records if r.get("taps") == list(layers)]
    loaded = load_features(cache, records)
    data = sequences(loaded)
    train, valid = _split(data, loaded, VALID_SHARE)
    answer_tokens = sum(len(r["answer_ids"]) for r in loaded)
    by_class: dict[str, int] = {}
    for r in loaded:
        by_class[f"{r['class']}/{r['mode']}"] = by_class.get(f"{r['class']}/{r['mode']}", 0) + len(r["answer_ids"])
    log(f"on-policy data: {len(loaded)} answers, {answer_tokens} answer tokens ({len(train)} train, {len(valid)} valid "
        f"sequences); taps {list(layers)}")
    V = int(target.config.vocab_size)
    eos = sorted(getattr(getattr(target, "tokenizer", None), "eos_token_ids", ()) or ())
    labels = [s.labels[s.answer_start - 1:] for s in train]
    counts = vocab.label_counts(labels, V)
    prior = _prior_vocabulary(request.init_from)
    if prior is not None:  # ids the answers never name rank by the warm-start file's vocabulary
        counts[prior[prior < V]] += 0.5
    draft_ids = vocab.top_ids(counts, request.draft_vocab, always=eos)
    cover = vocab.coverage([s.labels[s.answer_start - 1:] for s in valid or train], draft_ids)
    log(f"draft vocabulary: {draft_ids.numel()} tokens from the answers' label counts"
        + (" (unseen ids ranked by the warm-start file's vocabulary)" if prior is not None else "")
        + f", covering {cover:.1%} of held-back answer labels")
    cfg = attrs.evolve(_config(target, draft_ids.numel()), feature_layers=layers)
    module = NextNModule(cfg, V)
    module.draft_ids.copy_(draft_ids)
    init = _initialise(module, request.model_path, L, request.loop.seed, from_target=request.init_from_target,
                       layer=request.init_layer)
    if request.init_from:
        init = _warm_start(module, request.init_from) + f"; head rows: {init}"
    _fc_from_high_tap(module, request.model_path)
    log(f"initialised from {init}; fc reads tap {layers[-1]}")
    module.head.requires_grad_(False)
    if request.freeze_layer:  # only fc, the input projection and the norms learn
        for name in LAYER:
            getattr(module, name).requires_grad_(False)
    module.to(device)
    with torch.inference_mode():
        embed = target.embed(list(range(V))).float()  # [V, H]
    batches = _Batches(train, embed.clone().to(device), draft_ids, V, request.batch, device,
                       restart_share=request.restart_share)
    before = answer_accuracy(module, batches, valid, request.unroll) if valid else {}
    history = loop.run(module, request.loop, batches.sample,
                       lambda batch: _losses(module, batch, request.unroll, 0.0), log=log, progress=progress)
    after = answer_accuracy(module, batches, valid, request.unroll) if valid else {}
    served = answer_accuracy(module, batches, valid, request.unroll, context_rows=DEFAULT_CATCH_UP_ROWS) if valid else {}
    log("held-back answer tokens, accuracy per step: before " + _metrics(before) + " | after " + _metrics(after)
        + f" | after, head context from the prompt's last {DEFAULT_CATCH_UP_ROWS} rows " + _metrics(served))
    module.cpu()
    recipe = {
        "kind": KIND, "steps": request.loop.steps, "lr": request.loop.lr, "warmup": request.loop.warmup,
        "batch": request.batch, "unroll": request.unroll, "draft_vocab": int(draft_ids.numel()),
        "draft_vocab_answer_coverage": round(cover, 4), "feature_layers": list(layers), "seed": request.loop.seed,
        "init": init, "init_from": Path(request.init_from).name if request.init_from else None,
        "restart_share": request.restart_share, "freeze_layer": request.freeze_layer,
        "valid_answer_accuracy_before": {k: round(v, 4) for k, v in before.items()},
        "valid_answer_accuracy": {k: round(v, 4) for k, v in after.items()},
        "valid_answer_accuracy_served_context": {k: round(v, 4) for k, v in served.items()},
    }
    manifest = {
        "data": "on-policy: the target's own answers (greedy, and sampled at temperature 0.8, top-p 0.95) to a "
                "seeded prompt mix (tsspec_training.onpolicy.prompt_mix); no held-out or benchmark prompt",
        "modes": list(MODES), "prompts": len({(r["system"], r["prompt"]) for r in loaded}), "answers": len(loaded),
        "answer_tokens": answer_tokens, "answer_tokens_by_class_mode": by_class, "max_answer_tokens": request.data.answer_tokens,
        "licenses": MIX_LICENSES, "recipe": recipe,
        "generation_runs": read_cache(cache / "runs.jsonl"),  # answers, tokens, seconds, batch, threads
    }
    facts = {**request.identity, "vocab_size": V, "architecture": target.config.architecture}
    write_nextn(request.out_path, module, target=facts, manifest=manifest, outtype=request.outtype,
                recommended=request.recommended or None)
    log(f"wrote {request.out_path}")
    return {"path": request.out_path, "history": history, "before": before, "after": after, "recipe": recipe}
