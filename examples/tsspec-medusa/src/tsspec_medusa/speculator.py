"""MedusaSpeculator: a chain of the Medusa heads' top-1 tokens, and the factory that decides
whether it can serve a target.

Where the hidden row comes from. The shared loop gives ``DraftContext.carry_hidden``: the
trunk's last post-norm hidden row at position ``p - 1``, the row whose logits predicted
``last_token`` (at position ``p``, not yet in the cache). Medusa head k on the row at t
predicts the token at ``t + k + 2``, so on ``carry_hidden`` head 0 predicts position ``p + 1``
(the first draft), head 1 position ``p + 2``, and so on: one pass of the heads gives the
whole chain. That is why the speculator keeps no state of its own: it has no ``commit`` or
``reset`` (their defaults do nothing), and it can arm after a KV prefix it never saw
(``can_arm_after_prefix_reuse``).

The confidence gate: the chain's estimated survival, the product of the heads' top-1
probabilities (after the sampler's logit adjustments), must stay at or above
``min_draft_prob`` (``--spec-pmin``, set by tsspec's registry); the chain stops at the first head
that drops it below. The default, 0, proposes every head and leaves the cost to the governor.

Only a chain is proposed: Medusa's tree of candidates (several tokens per head, verified
with a tree attention mask) needs a tree-verify target API that tsspec does not have.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

import tsspec
from tsspec import DraftContext, SpeculatorDeclined

from .heads import MedusaHeads
from .weights import MedusaFileError, read_medusa, read_medusa_info

__all__ = ["NAME", "NO_FILE_REASON", "DRAFTER_HINT", "MedusaSpeculator", "make_medusa", "attach_medusa",
           "load_heads"]

NAME = "medusa"
DRAFTER_HINT = "a Medusa heads GGUF (--spec-draft-model PATH, general.architecture = medusa)"
NO_FILE_REASON = f"no Medusa file attached: attach {DRAFTER_HINT}"
HEADS_CACHE_SIZE = 2  # loaded files kept, keyed by (path, size, mtime): a server reuses them


class MedusaSpeculator:
    """The ``medusa`` algorithm over loaded heads: ``name`` and ``propose``, plus the three
    facts that differ from tsspec's defaults (``tsspec.SpeculatorInfo``)."""

    name = NAME
    needs_hidden_state = True
    can_arm_after_prefix_reuse = True  # stateless: carry_hidden is all it needs

    def __init__(self, heads: MedusaHeads, *, max_draft_tokens: int | None = None, min_draft_prob: float = 0.0):
        self.heads: MedusaHeads | None = heads
        limit = heads.head_count if max_draft_tokens is None else int(max_draft_tokens)
        self.max_draft_tokens = max(0, min(limit, heads.head_count))  # one token per head
        self.min_draft_prob = float(min_draft_prob)  # the registry sets it to the gate in force
        self.proposals = 0  # counters for tests and diagnostics
        self.gated = 0  # proposals the confidence gate cut short

    def propose(self, ctx: DraftContext) -> list[int]:
        heads = self.heads
        count = min(self.max_draft_tokens, ctx.max_tokens)
        if heads is None or ctx.carry_hidden is None or count <= 0:
            return []
        self.proposals += 1
        if heads.device != ctx.carry_hidden.device:
            heads = self.heads = heads.to(ctx.carry_hidden.device)
        logits = heads.logits(ctx.carry_hidden, count)  # [count, V]
        drafts: list[int] = []
        survival = 1.0
        for k in range(count):
            row = logits[k]  # [V]
            if ctx.adjust_logits is not None:
                row = ctx.adjust_logits(row, ctx.preceding(drafts))  # history then drafts, no copy
            p, token = torch.max(torch.softmax(row.to(torch.float32), dim=-1), dim=-1)
            survival *= float(p)
            if survival < self.min_draft_prob:
                self.gated += 1
                break
            drafts.append(int(token))
        return drafts

    def close(self) -> None:
        self.heads = None  # drop this speculator's reference; the file cache keeps its own


@functools.lru_cache(maxsize=HEADS_CACHE_SIZE)
def _load_cached(path: str, size: int, mtime_ns: int) -> MedusaHeads:
    return read_medusa(path)


def load_heads(path: str | os.PathLike[str]) -> MedusaHeads:
    """Read a Medusa file's heads, reusing the last loads of an unchanged file."""
    real = os.path.realpath(path)
    try:
        stat = os.stat(real)
    except OSError:
        return read_medusa(path)  # raises the one-line MedusaFileError
    return _load_cached(real, stat.st_size, stat.st_mtime_ns)


def make_medusa(target: Any, options: tsspec.SpeculationOptions | None = None) -> MedusaSpeculator:
    """The speculator for ``target``, or ``SpeculatorDeclined`` saying why it cannot serve it."""
    path = options.drafter_path if options is not None else None
    if not path:
        raise SpeculatorDeclined(NO_FILE_REASON)
    try:
        heads = load_heads(path)
    except MedusaFileError as exc:
        raise SpeculatorDeclined(f"{exc} (attach {DRAFTER_HINT})") from None
    config = target.config
    if heads.vocab_size != config.vocab_size:
        raise SpeculatorDeclined(
            f"the Medusa file {path} has a vocabulary of {heads.vocab_size}, the model {config.vocab_size}"
        )
    if heads.hidden_size != config.hidden_size:
        raise SpeculatorDeclined(
            f"the Medusa file {path} has hidden size {heads.hidden_size}, the model {config.hidden_size}"
        )
    # the heads read the last post-norm hidden state; a factory must not reset taps that an
    # attached block drafter set (the target is shared), so tapped rows are a decline
    tsspec.require_feature_width(target, heads.hidden_size, "Medusa heads (the last hidden state)",
                                 "feature taps set for another drafter?")
    return MedusaSpeculator(heads)


def attach_medusa(target: Any, path: str, options: Any) -> None:
    """The drafter hook's attach function for ``general.architecture = medusa`` files.

    Medusa heads are not a ``DraftHead`` (they never consume tokens), so nothing is attached to
    the target: the ``medusa`` factory reads the file from the options. Registering the
    architecture lets ``--spec-draft-model heads.gguf`` load and rejects a malformed file up
    front with a one-line error.
    """
    read_medusa_info(path)  # sizes that do not fit the target are the factory's decline
    return None
