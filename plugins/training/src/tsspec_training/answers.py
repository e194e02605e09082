"""The target's greedy answers to many prompts at once, over its batched paged forward.

Answering prompts one row per step leaves a CPU target mostly idle: a step of one row costs
nearly what a step of several rows costs. ``batched_greedy`` keeps up to ``batch`` sequences in
flight in the target's paged KV (``spec_open_paged``, the serving path) and runs every
sequence's next row in ONE forward: decode rows first (one per answering sequence), then prompt
chunks of the sequences still reading their prompt, never more rows than the paged forward
takes. On a batch-invariant trunk each sequence's logits are what a forward of that sequence
alone gives, so the answers are the target's own greedy answers.

A target without a paged path (``spec_open_paged`` missing or refusing) is answered one prompt
at a time (``teacher.greedy_answer``), with the same result.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import attrs
import torch

from tsspec.protocols import PagedRows

__all__ = ["batched_answers", "batched_greedy", "open_paged_or_none"]

BLOCK = 16  # KV positions per paged block


@attrs.define
class _Slot:
    """One sequence in flight: its prompt, how much of it the KV holds, its answer so far."""

    index: int  # into the caller's prompt list
    prompt: list[int]
    blocks: list[int]
    past: int = 0
    answer: list[int] = attrs.field(factory=list)
    hidden: list = attrs.field(factory=list)  # feature rows [n, F] of each forward (want_hidden)
    argmax: list[int] = attrs.field(factory=list)  # the target's argmax at each answer row

    @property
    def reading(self) -> bool:
        return self.past < len(self.prompt)


def open_paged_or_none(target, num_blocks: int, block_size: int = BLOCK):
    """The target's paged KV, or None where it has none (then answer one prompt at a time)."""
    from tsspec.capabilities import target_info

    if not target_info(target).batched:
        return None
    try:
        return target.spec_open_paged(num_blocks, block_size)
    except (ValueError, NotImplementedError):
        return None


@torch.inference_mode()
def batched_greedy(
    target,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    eos: frozenset[int] = frozenset(),
    batch: int = 8,
    on_done: Callable[[int, list[int]], None] = lambda i, ids: None,
) -> list[list[int]] | None:
    """Greedy answers (at most ``max_new_tokens`` ids each, ending at the first ``eos`` id) of
    every prompt, in order; ``on_done(i, answer)`` as each finishes. None when the target has
    no paged path (the caller answers one prompt at a time)."""
    return batched_answers(target, prompts, max_new_tokens, eos=eos, batch=batch, on_done=on_done)


def _argmax(index: int, logits: torch.Tensor, position: int, preceding: Sequence[int]) -> int:
    return int(torch.argmax(logits).item())


@torch.inference_mode()
def batched_answers(
    target,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    eos: frozenset[int] = frozenset(),
    batch: int = 8,
    on_done: Callable[[int, list[int]], None] = lambda i, ids: None,
    pick: Callable[[int, torch.Tensor, int, Sequence[int]], int] = _argmax,
    on_features: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> list[list[int]] | None:
    """``batched_greedy`` with the next token chosen by ``pick(i, logits [vocab], position,
    preceding ids)`` (prompt i's own sampler, say); the default is the argmax.

    ``on_features(i, hidden, argmax)``, when given, gets each finished sequence's feature rows
    (the target's hidden rows, its feature taps when set) for prompt + answer but the last
    token, hidden [P + n - 1, F] float16, and the target's argmax at each answer row [n]
    (what greedy verification emits there, whatever ``pick`` drew)."""
    want_hidden = on_features is not None
    if not prompts:
        return []
    longest = max(len(p) for p in prompts) + max_new_tokens + 1
    per_slot = math.ceil(longest / BLOCK)
    paged = open_paged_or_none(target, per_slot * batch, BLOCK)
    if paged is None:
        return None
    max_rows = int(getattr(paged, "max_batch_rows", 0) or 64)
    batch = max(1, min(batch, max_rows // 2))
    answers: list[list[int] | None] = [None] * len(prompts)
    waiting = list(range(len(prompts)))[::-1]  # pop() takes the next prompt in order
    free = list(range(batch))[::-1]
    active: dict[int, _Slot] = {}  # slot id -> sequence
    while waiting or active:
        while waiting and free:
            slot = free.pop()
            i = waiting.pop()
            active[slot] = _Slot(i, list(prompts[i]), list(range(slot * per_slot, (slot + 1) * per_slot)))
        rows: list[PagedRows] = []
        owners: list[int] = []
        budget = max_rows
        for slot, s in sorted(active.items()):  # answering sequences: one row each
            if not s.reading:
                rows.append(PagedRows(s.blocks, s.past, [s.answer[-1]], want_hidden=want_hidden, seq=slot))
                owners.append(slot)
                budget -= 1
        for slot, s in sorted(active.items()):  # then prompt chunks, in what rows are left
            if s.reading and budget > 0:
                chunk = s.prompt[s.past : s.past + budget]
                rows.append(PagedRows(s.blocks, s.past, chunk, want_hidden=want_hidden, seq=slot))
                owners.append(slot)
                budget -= len(chunk)
        outputs = paged.forward(rows)
        for slot, r, (logits, hidden) in zip(owners, rows, outputs):
            s = active[slot]
            s.past += len(r.tokens)
            if want_hidden:
                s.hidden.append(hidden.to(torch.float16))  # [rows, F]
            if s.reading:
                continue
            token = pick(s.index, logits[-1], s.past, s.prompt + s.answer)
            if want_hidden:
                s.argmax.append(int(torch.argmax(logits[-1]).item()))
            s.answer.append(token)
            if token in eos or len(s.answer) >= max_new_tokens:
                answers[s.index] = s.answer
                on_done(s.index, s.answer)
                if on_features is not None:
                    on_features(s.index, torch.cat(s.hidden, dim=0), torch.tensor(s.argmax, dtype=torch.long))
                from tsspec.capabilities import paged_info

                release = paged_info(paged).release
                if release is not None:
                    release(slot)
                del active[slot]
                free.append(slot)
    return [a for a in answers if a is not None]
