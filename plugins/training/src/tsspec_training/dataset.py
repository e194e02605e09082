"""Assembling a drafter's training set: corpus -> token sequences -> teacher data, cached.

``build(target, target_path, spec)`` returns ``(sequences, manifest)``. The teacher data is
cached under ``spec.cache_dir`` keyed by the target's identity and every setting that changes
it, and the chat answers have their own cache (they cost the most to make), so a second run, or
one for another drafter kind with the same taps, starts training at once.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import attrs
import torch

from . import corpus, prompts, teacher

__all__ = ["DataSpec", "build", "build_held_out", "default_cache_dir", "CHAT_SOURCE"]

CHAT_SOURCE = "chat-answers"  # the source name of the target's own answers in a training set


def default_cache_dir() -> Path:
    base = os.environ.get("TSSPEC_TRAIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tsspec", "training"
    )
    return Path(base)


@attrs.frozen
class DataSpec:
    seq_len: int = 256
    stdlib_chars: int = 150_000  # per stdlib source (docstrings, source)
    package_chars: int = 100_000
    prompts: int = 300  # generated prompts (held-out ones are dropped)
    # further prompts answered on top of ``prompts`` (drawn from a larger pool, the first
    # ``prompts`` kept as they are): their teacher rows are cached in a file of their own, so
    # more answer data costs only the new answers, not a second pass over the whole corpus
    more_prompts: int = 0
    answer_tokens: int = 128
    soft_k: int = 0
    taps: tuple[int, ...] | None = None
    seed: int = 0
    cache_dir: str = ""
    # token sequences to use INSTEAD of the corpus (tests; users who bring their own token data)
    sequences: tuple[tuple[int, ...], ...] | None = None

    def key(self, identity: str) -> str:
        fields = attrs.asdict(self)
        fields.pop("cache_dir")
        if fields["sequences"] is None:
            fields.pop("sequences")  # keys of corpus-built data stay as they were
        if not fields["more_prompts"]:
            fields.pop("more_prompts")  # likewise for data without further answers
        text = json.dumps({"target": identity, **fields}, sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_dir(spec: DataSpec) -> Path:
    return Path(spec.cache_dir) if spec.cache_dir else default_cache_dir()


def build(target, identity: str, spec: DataSpec, *, progress=None, log=print):
    """(teacher sequences, manifest dict). ``identity`` names the target (its sha256 or digest)."""
    progress = progress or (lambda it, **_: it)
    if spec.more_prompts and spec.sequences is None:
        base, manifest = build(target, identity, attrs.evolve(spec, more_prompts=0), progress=progress, log=log)
        more, info = _more_answers(target, identity, spec, progress, log)
        return base + more, _with_more(manifest, info, more)
    cache = _cache_dir(spec)
    cache.mkdir(parents=True, exist_ok=True)
    data_path = cache / f"teacher-{spec.key(identity)}.pt"
    if data_path.exists():
        saved = torch.load(data_path, weights_only=False)
        log(f"teacher data: cached {data_path} ({len(saved['sequences'])} sequences)")
        return [teacher.TeacherSequence(**s) for s in saved["sequences"]], saved["manifest"]

    if spec.sequences is not None:
        sequences = [("given", list(s)[: spec.seq_len]) for s in spec.sequences]
        infos = {"given": corpus.SourceInfo("given", "token sequences given by the caller", "the caller's")}
    else:
        sequences, infos = _corpus_sequences(target, identity, spec, cache, progress, log)
    return _teacher(target, spec, sequences, infos, data_path, progress, log)


def build_held_out(target, identity: str, spec: DataSpec, count: int, *, progress=None, log=print):
    """Teacher data of the target's answers to ``count`` held-out prompts
    (``prompts.held_out_prompts``: never in a training corpus), for the acceptance check.
    Cached beside the training data; [] when ``count`` is 0 or the target has no tokenizer."""
    progress = progress or (lambda it, **_: it)
    if count < 1 or target.tokenizer is None:
        return []
    cache = _cache_dir(spec)
    cache.mkdir(parents=True, exist_ok=True)
    # further training answers do not change the held-out set: its cache stays the base data's
    key = hashlib.sha256(json.dumps([attrs.evolve(spec, more_prompts=0).key(identity), count]).encode()).hexdigest()[:16]
    data_path = cache / f"held-out-{key}.pt"
    chosen = prompts.held_out_prompts(count * 12, spec.seed)[:count]
    records = teacher.answer_prompts(  # cached: answers nothing when the file holds them all
        target, chosen, cache / f"held-out-answers-{identity[:16]}-{spec.answer_tokens}.jsonl",
        max_new_tokens=spec.answer_tokens, progress=lambda it: progress(it, desc="held-out answers"), log=log,
    )
    starts = [min(len(r["prompt_ids"]), spec.seq_len) for r in records]
    if data_path.exists():
        saved = torch.load(data_path, weights_only=False)
        data = [teacher.TeacherSequence(**s) for s in saved["sequences"]]
        for seq, start in zip(data, starts):  # data cached before sequences carried it
            seq.answer_start = start
        return data
    sequences = [("held-out", ids[: spec.seq_len]) for ids in teacher.chat_sequences(records)]
    data = teacher.collect(target, sequences, taps=spec.taps, soft_k=spec.soft_k, log=log)
    for seq, start in zip(data, starts):
        seq.answer_start = start
    tmp = data_path.with_suffix(".tmp")
    torch.save({"sequences": [attrs.asdict(s) for s in data]}, tmp)
    tmp.replace(data_path)
    return data


def _corpus_sequences(target, identity: str, spec: DataSpec, cache: Path, progress, log):
    """(source, ids) sequences of the default corpus and its manifest entries."""
    tok = target.tokenizer
    if tok is None:
        raise ValueError("the target has no tokenizer: the corpus cannot be tokenised (give token sequences)")
    infos: dict[str, corpus.SourceInfo] = {}
    sequences: list[tuple[str, list[int]]] = []
    bos = [tok.bos_token_id] if getattr(tok, "bos_token_id", None) is not None else []

    docs, code, stdlib_info = corpus.stdlib_sources(spec.stdlib_chars, spec.seed)
    pkg_docs, pkg_info = corpus.package_docs(spec.package_chars, spec.seed)
    for info in [*stdlib_info, pkg_info]:
        infos[info.name] = info
    for doc in [*docs, *code, *pkg_docs]:
        ids = tok.encode(doc.text, add_special_tokens=False)
        for chunk in teacher.chunk_ids(ids, spec.seq_len, prefix=bos):
            sequences.append((doc.source, chunk))

    chosen = prompts.training_prompts(spec.prompts, spec.seed)
    answers_path = cache / f"answers-{identity[:16]}-{spec.answer_tokens}.jsonl"
    log(f"chat answers: {len(chosen)} prompts -> {answers_path}")
    records = teacher.answer_prompts(
        target, chosen, answers_path, max_new_tokens=spec.answer_tokens,
        progress=lambda it: progress(it, desc="answers"), log=log,
    )
    infos[CHAT_SOURCE] = corpus.SourceInfo(
        CHAT_SOURCE,
        f"the target's greedy answers to {len(records)} generated instruction prompts (tsspec_training.prompts, "
        f"seed {spec.seed}; held-out prompts excluded)",
        "model output of the target (its license)",
        len(records),
        sum(len(tok.decode(r["answer_ids"])) for r in records),
    )
    for ids in teacher.chat_sequences(records):
        sequences.append((CHAT_SOURCE, ids[: spec.seq_len]))
    return sequences, infos


MORE_POOL = 2000  # generated prompts the further ones are drawn from (a fixed pool: see more_prompts)


def more_prompts(spec: DataSpec) -> list[str]:
    """The ``spec.more_prompts`` training prompts after the first ``spec.prompts``: the first of a
    fixed seeded pool (``MORE_POOL`` generated prompts, training ones only) that are not in the
    first set, so a smaller count is a prefix of a larger one (fewer when the pool runs out)."""
    first = set(prompts.training_prompts(spec.prompts, spec.seed))
    pool = prompts.training_prompts(max(MORE_POOL, spec.prompts + spec.more_prompts), spec.seed)
    return [p for p in pool if p not in first][: spec.more_prompts]


def _more_answers(target, identity: str, spec: DataSpec, progress, log):
    """Teacher data of the target's answers to ``more_prompts(spec)``, cached in a file of its own
    (the base data's cache is untouched); (sequences, the answers' SourceInfo)."""
    tok = target.tokenizer
    if tok is None:
        raise ValueError("the target has no tokenizer: no prompts can be answered")
    cache = _cache_dir(spec)
    cache.mkdir(parents=True, exist_ok=True)
    chosen = more_prompts(spec)
    records = teacher.answer_prompts(
        target, chosen, cache / f"answers-{identity[:16]}-{spec.answer_tokens}.jsonl",
        max_new_tokens=spec.answer_tokens, progress=lambda it: progress(it, desc="more answers"), log=log,
    )
    info = corpus.SourceInfo(CHAT_SOURCE, "", "", len(records),
                             sum(len(tok.decode(r["answer_ids"])) for r in records))
    data_path = cache / f"teacher-more-{spec.key(identity)}.pt"
    if data_path.exists():
        saved = torch.load(data_path, weights_only=False)
        log(f"teacher data of {len(records)} further answers: cached {data_path}")
        return [teacher.TeacherSequence(**s) for s in saved["sequences"]], info
    sequences = [(CHAT_SOURCE, ids[: spec.seq_len]) for ids in teacher.chat_sequences(records)]
    log(f"teacher forcing {len(records)} further answers: {sum(len(s) for _, s in sequences)} tokens")
    data = teacher.collect(target, sequences, taps=spec.taps, soft_k=spec.soft_k,
                           progress=lambda it: progress(it, desc="teacher (more)"), log=log)
    tmp = data_path.with_suffix(".tmp")
    torch.save({"sequences": [attrs.asdict(s) for s in data]}, tmp)
    tmp.replace(data_path)
    return data, info


def _with_more(manifest: dict, info, more) -> dict:
    """The base manifest with the further answers counted in the chat-answers source."""
    tokens = sum(len(s.tokens) for s in more)
    sources = []
    for entry in manifest["sources"]:
        entry = dict(entry)
        if entry["name"] == CHAT_SOURCE:
            base_docs = entry["documents"]
            entry["documents"] += info.documents
            entry["characters"] += info.characters
            entry["tokens"] += tokens
            entry["origin"] += f"; then {info.documents} further prompts (more_prompts) on top of those {base_docs}"
        sources.append(entry)
    return {**manifest, "sources": sources, "tokens": manifest["tokens"] + tokens,
            "sequences": manifest["sequences"] + len(more)}


def _teacher(target, spec: DataSpec, sequences, infos, data_path: Path, progress, log):
    for source, ids in sequences:
        infos[source].tokens += len(ids)
    log(f"teacher forcing: {len(sequences)} sequences, {sum(len(s) for _, s in sequences)} tokens")
    data = teacher.collect(
        target, sequences, taps=spec.taps, soft_k=spec.soft_k,
        progress=lambda it: progress(it, desc="teacher"), log=log,
    )
    manifest = {
        "sources": [infos[k].to_json() for k in sorted(infos)],
        "tokens": sum(len(s) for _, s in sequences),
        "sequences": len(sequences),
        "seq_len": spec.seq_len,
        "seed": spec.seed,
        "held_out": "prompts whose sha256 ends in a byte below "
        f"{int(prompts.HELD_OUT_SHARE * 256)} (tsspec_training.prompts.is_held_out) and every benchmark prompt",
    }
    tmp = data_path.with_suffix(".tmp")
    torch.save({"sequences": [attrs.asdict(s) for s in data], "manifest": manifest}, tmp)
    tmp.replace(data_path)
    return data, manifest


def split(data: Sequence[teacher.TeacherSequence], valid_share: float, seed: int):
    """(train, valid) by a seeded permutation."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(data), generator=g).tolist()
    n_valid = max(1, int(len(data) * valid_share)) if len(data) > 1 else 0
    valid = [data[i] for i in order[:n_valid]]
    train = [data[i] for i in order[n_valid:]]
    return train, valid
