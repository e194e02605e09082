"""The target as teacher: its own chat answers, and teacher-forcing passes over token sequences.

``answer_prompts`` lets the target answer instruction prompts greedily (several at a time on its
paged path, see ``answers``; else one row per step) and appends each answer to a JSONL cache,
so an interrupted run resumes where it stopped.

``collect`` runs the target over each sequence from position 0 in ONE multi-row ``spec_forward``
(the KV cache is rewound between sequences; an untapped target returns hidden rows only and
``output_matrix`` scores them in one dense matmul) and keeps, per position i:

* ``hidden[i]``  the row that predicts token i+1 (the trunk's post-norm row, or the tapped
  residuals when ``taps`` are set): what the drafter conditions on;
* ``labels[i]``  the target's argmax at row i: the token verification would emit after i;
* ``topk_ids[i]`` / ``topk_logits[i]``  its top-``soft_k`` logits (for the optional KL loss);
* ``answer_start``  for a prompt + answer, the first answer token's position (the accuracy a
  drafter shows on answer tokens is the one that serving sees; a chat template's fixed system
  prompt is easy to predict and would flatter it).

Labels are the TARGET's predictions, never the corpus's next tokens: the drafter learns what
verification accepts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import attrs
import torch

__all__ = ["TeacherSequence", "answer_prompts", "collect", "chat_sequences", "output_matrix"]


@attrs.define
class TeacherSequence:
    source: str
    tokens: torch.Tensor  # [L] int64
    hidden: torch.Tensor  # [L, F] float16
    labels: torch.Tensor  # [L] int64: target argmax at each row
    topk_ids: torch.Tensor | None = None  # [L, k] int64
    topk_logits: torch.Tensor | None = None  # [L, k] float16
    # chat sequences: the first answer token's position (the prompt, chat template included,
    # comes before it); 0 when the sequence is not a prompt + answer or it is unknown
    answer_start: int = 0


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
    batch: int = 8,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """Each prompt's chat-formatted ids and the target's greedy answer, cached in ``cache_path``
    (JSONL, appended as answers are written; prompts already there are not answered again).

    Up to ``batch`` prompts are answered together on the target's paged path
    (``tsspec_training.answers``); a target without one answers them one at a time."""
    from .answers import batched_greedy

    tok = target.tokenizer
    done: dict[str, dict] = {}
    if cache_path.exists():
        for line in cache_path.read_text("utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["prompt"]] = rec
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    todo = [p for p in prompts if p not in done]
    ids_of = []
    for prompt in todo:
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids_of.append(tok.encode(text, add_special_tokens=False))
    with open(cache_path, "a", encoding="utf-8") as handle:

        def write(i: int, answer: list[int]) -> None:
            rec = {"prompt": todo[i], "prompt_ids": ids_of[i], "answer_ids": list(answer)}
            handle.write(json.dumps(rec) + "\n")
            handle.flush()
            done[todo[i]] = rec

        began, written = time.perf_counter(), len(done)
        answered = batched_greedy(target, ids_of, max_new_tokens, eos=_eos_ids(target), batch=batch,
                                  on_done=write) if todo and batch > 1 else None
        if answered is None and todo:
            for i in progress(range(len(todo))):
                write(i, greedy_answer(target, ids_of[i], max_new_tokens))
        if todo and log is not None:
            made = sum(len(done[p]["answer_ids"]) for p in todo)
            seconds = time.perf_counter() - began
            log(f"chat answers: {len(done) - written} written, {made} tokens in {seconds:.0f}s "
                f"({made / max(seconds, 1e-9):.1f} tokens/s, {'batched' if answered is not None else 'one at a time'})")
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
def output_matrix(target) -> torch.Tensor | None:
    """The target's output projection as a dense [vocab, H] float32 matrix, read through its
    ``lm_head`` on the identity rows (None when the target offers no ``lm_head``).

    A teacher forward then asks the trunk for its hidden rows only and scores them with one
    dense matmul: a quantised LM head run row by row over every position of a long chunk costs
    several times the rest of the forward."""
    head = getattr(target, "lm_head", None)
    width = int(getattr(target, "spec_feature_size", 0) or 0)
    if head is None or width < 1:
        return None
    return head(torch.eye(width)).t().float().contiguous()  # [vocab, H]


@torch.inference_mode()
def teacher_pass(target, tokens: Sequence[int], *, soft_k: int = 0, head: torch.Tensor | None = None) -> TeacherSequence:
    """One multi-row forward over ``tokens`` from position 0. ``head`` [vocab, H] (see
    ``output_matrix``; untapped targets only): logits from the hidden rows with it, instead of
    the target's own LM head on every row."""
    target.spec_rewind_cache(0)
    target.spec_ensure_capacity(len(tokens))
    logits, hidden = target.spec_forward(list(tokens), all_logits_rows=head is None, want_hidden=True)
    target.spec_rewind_cache(0)
    if head is not None:
        logits = torch.nn.functional.linear(hidden.float(), head)  # [L, vocab]
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
    log: Callable[[str], None] | None = None,
) -> list[TeacherSequence]:
    """Teacher-forcing data for (source, tokens) pairs; taps (if any) are unset afterwards."""
    head = None if taps else output_matrix(target)  # tapped rows are not the head's input
    if taps:
        target.spec_set_feature_taps(list(taps))
    try:
        out = []
        began, count = time.perf_counter(), 0
        for source, tokens in progress(sequences):
            seq = teacher_pass(target, tokens, soft_k=soft_k, head=head)
            seq.source = source
            out.append(seq)
            count += len(tokens)
        if log is not None and count:
            seconds = time.perf_counter() - began
            log(f"teacher forcing: {count} tokens in {seconds:.0f}s ({count / max(seconds, 1e-9):.1f} tokens/s)")
        return out
    finally:
        if taps:
            target.spec_set_feature_taps(None)
