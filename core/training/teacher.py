"""The target as teacher: its own chat answers, and teacher-forcing passes over token sequences.

``answer_prompts`` lets the target answer instruction prompts greedily (one row per step) and
appends each answer to a JSONL cache, so an interrupted run resumes where it stopped.

``collect`` runs the target over each sequence from position 0 in ONE multi-row ``spec_forward``
(the KV cache is rewound between sequences) and keeps, per position i:

* ``hidden[i]``  the row that predicts token i+1 (the trunk's post-norm row, or the tapped
  residuals when ``taps`` are set): what the drafter conditions on;
* ``labels[i]``  the target's argmax at row i: the token verification would emit after i;
* ``topk_ids[i]`` / ``topk_logits[i]``  its top-``soft_k`` logits (for the optional KL loss).

Labels are the TARGET's predictions, never the corpus's next tokens: the drafter learns what
verification accepts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Sequence

import attrs
import torch

__all__ = ["TeacherSequence", "answer_prompts", "collect", "chat_sequences"]


@attrs.define
class TeacherSequence:
    source: str
    tokens: torch.Tensor  # [L] int64
    hidden: torch.Tensor  # [L, F] float16
    labels: torch.Tensor  # [L] int64: target argmax at each row
    topk_ids: torch.Tensor | None = None  # [L, k] int64
    topk_logits: torch.Tensor | None = None  # [L, k] float16


def _eos_ids(target) -> frozenset[int]:
    tok = getattr(target, "tokenizer", None)
    return frozenset(getattr(tok, "eos_token_ids", ()) or ())


@torch.inference_mode()
def greedy_answer(target, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """The target's greedy continuation of ``prompt_ids`` (stops at an end-of-generation id)."""
    eos = _eos_ids(target)
    target.spec_rewind_cache(0)
    target.spec_ensure_capacity(len(prompt_ids) + max_new_tokens + 1)
    logits, _ = target.spec_forward(list(prompt_ids), all_logits_rows=False, want_hidden=False)
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = int(torch.argmax(logits[-1]).item())
        out.append(token)
        if token in eos:
            break
        logits, _ = target.spec_forward([token], all_logits_rows=False, want_hidden=False)
    target.spec_rewind_cache(0)
    return out


def answer_prompts(
    target,
    prompts: Sequence[str],
    cache_path: Path,
    *,
    max_new_tokens: int,
    progress: Callable[[Iterable], Iterable] = lambda it: it,
) -> list[dict]:
    """Each prompt's chat-formatted ids and the target's greedy answer, cached in ``cache_path``
    (JSONL, appended as answers are written; prompts already there are not answered again)."""
    tok = target.tokenizer
    done: dict[str, dict] = {}
    if cache_path.exists():
        for line in cache_path.read_text("utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["prompt"]] = rec
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    todo = [p for p in prompts if p not in done]
    with open(cache_path, "a", encoding="utf-8") as handle:
        for prompt in progress(todo):
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
            ids = tok.encode(text, add_special_tokens=False)
            answer = greedy_answer(target, ids, max_new_tokens)
            rec = {"prompt": prompt, "prompt_ids": ids, "answer_ids": answer}
            handle.write(json.dumps(rec) + "\n")
            handle.flush()
            done[prompt] = rec
    return [done[p] for p in prompts if p in done]


def chat_sequences(records: Sequence[dict]) -> list[list[int]]:
    """Prompt + answer ids of each cached answer."""
    return [list(r["prompt_ids"]) + list(r["answer_ids"]) for r in records]


def chunk_ids(ids: Sequence[int], length: int, *, prefix: Sequence[int] = (), min_length: int = 16) -> list[list[int]]:
    """Split a token list into sequences of at most ``length`` tokens, each led by ``prefix``."""
    body = length - len(prefix)
    out = []
    for start in range(0, len(ids), body):
        piece = list(ids[start : start + body])
        if len(piece) >= min_length:
            out.append([*prefix, *piece])
    return out


@torch.inference_mode()
def teacher_pass(target, tokens: Sequence[int], *, soft_k: int = 0) -> TeacherSequence:
    """One multi-row forward over ``tokens`` from position 0."""
    target.spec_rewind_cache(0)
    target.spec_ensure_capacity(len(tokens))
    logits, hidden = target.spec_forward(list(tokens), all_logits_rows=True, want_hidden=True)
    target.spec_rewind_cache(0)
    logits = logits.float()  # [L, vocab]
    seq = TeacherSequence(
        source="",
        tokens=torch.tensor(list(tokens), dtype=torch.long),
        hidden=hidden.to(torch.float16).clone(),  # [L, F]
        labels=torch.argmax(logits, dim=-1).to(torch.long),  # [L]
    )
    if soft_k > 0:
        values, ids = torch.topk(logits, soft_k, dim=-1)  # [L, k]
        seq.topk_ids, seq.topk_logits = ids.to(torch.long), values.to(torch.float16)
    return seq


def collect(
    target,
    sequences: Sequence[tuple[str, Sequence[int]]],
    *,
    taps: Sequence[int] | None = None,
    soft_k: int = 0,
    progress: Callable[[Iterable], Iterable] = lambda it: it,
) -> list[TeacherSequence]:
    """Teacher-forcing data for (source, tokens) pairs; taps (if any) are unset afterwards."""
    if taps:
        target.spec_set_feature_taps(list(taps))
    try:
        out = []
        for source, tokens in progress(sequences):
            seq = teacher_pass(target, tokens, soft_k=soft_k)
            seq.source = source
            out.append(seq)
        return out
    finally:
        if taps:
            target.spec_set_feature_taps(None)
