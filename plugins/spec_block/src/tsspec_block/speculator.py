"""BlockDraftSpeculator: the ``block`` algorithm over any BLOCK draft head (DFlash, DFlash2, DSpark).

One drafter pass proposes a whole window; the confidence gate keeps the longest prefix whose
CUMULATIVE probability (the product of the per-token confidences) stays at or above
``min_draft_prob`` (``--spec-pmin``, default 0.35: far stricter than the same number on a
per-token head, which gates each token alone). Example, pmin 0.35, confidences
``[0.9, 0.8, 0.6, 0.95]``: products 0.9, 0.72, 0.432, 0.41 -> all four kept; with a fifth
confidence of 0.5 the product falls to 0.205 and the fifth draft is dropped.

The gated prefix is proposed whole; the loop's cost governor decides whether drafting pays
(measure, park, re-probe with backoff).

Bounded catch-up: a proposal catches the head up on at most the newest ``catch_up_rows``
committed rows it has not seen (``DEFAULT_CATCH_UP_ROWS``, or the drafter's sliding window when
every layer slides: then the bound changes no draft). The first proposal of a sequence thus
injects the prompt's last rows, not the whole prompt, and a probe after a park its last rows,
whatever the park's length; rows committed before a gap are dropped unseen, as the bound would
have dropped them had every commit come. Output never changes (verification decides).

The head owns the drafter's context (a sliding KV ring fed by every commit); the factory takes a
per-sequence view of it when the head offers one (``for_sequence``), so sequences served at once
do not share a context. The speculator survives a reused KV prefix: the ring refills from the
freshly forwarded suffix (``can_arm_after_prefix_reuse``).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from tsspec.protocols import DraftContext, DraftHeadKind, SpeculatorDeclined, require_feature_width

__all__ = ["ALGORITHM", "DEFAULT_CATCH_UP_ROWS", "DEFAULT_MIN_DRAFT_PROB", "BlockDraftSpeculator", "context_rows",
           "gate_cumulative", "make_block_speculator"]

log = logging.getLogger("tsspec.block")

ALGORITHM = "block"
DEFAULT_MIN_DRAFT_PROB = 0.35
DEFAULT_WINDOW = 8
# newest unseen committed rows a proposal injects (full-attention drafters; a sliding one uses its
# window): a context bound, like draft-head's 8, that makes a probe's catch-up cost the same
# after a 400-token prompt or a 500-step park as after a short one
DEFAULT_CATCH_UP_ROWS = 64
DESCRIPTION = (
    "block drafter (DFlash / DFlash2 / DSpark): one drafter pass proposes a whole window, gated "
    "on the cumulative prefix probability"
)
DRAFTER_HINT = "a DFlash drafter file (--draft-model PATH)"


def gate_cumulative(tokens: Sequence[int], confidences: Sequence[float], pmin: float) -> list[int]:
    """The longest prefix of ``tokens`` whose running product of confidences stays >= pmin.

    >>> gate_cumulative([1, 2, 3], [0.9, 0.5, 0.9], 0.42)
    [1, 2]
    >>> gate_cumulative([1, 2], [float("nan"), 0.9], 0.0)
    []
    """
    kept: list[int] = []
    product = 1.0
    for token, conf in zip(tokens, confidences):
        product *= float(conf)
        if not product >= pmin:  # NaN confidences fail the gate too
            break
        kept.append(int(token))
    return kept


class BlockDraftSpeculator:
    """Proposes up to ``min(window, block_size - 1)`` tokens per step from a BLOCK head."""

    name = ALGORITHM
    default_min_draft_prob = DEFAULT_MIN_DRAFT_PROB
    needs_hidden_state = True  # the head's context is the target's tapped feature rows
    handles_own_prefill = False
    can_arm_after_prefix_reuse = True

    def __init__(self, head: Any, *, window: int = DEFAULT_WINDOW, min_draft_prob: float = DEFAULT_MIN_DRAFT_PROB,
                 feature_size: int | None = None, owns_head: bool = False,
                 catch_up_rows: int | None = DEFAULT_CATCH_UP_ROWS):
        self.head = head
        # head is a per-sequence view made for this speculator (for_sequence): close frees it
        self.owns_head = bool(owns_head)
        self.max_draft_tokens = max(0, min(int(window), int(head.block_size) - 1))
        self.min_draft_prob = float(min_draft_prob)
        self.feature_size = feature_size  # expected width of the hidden rows, when known
        self._warned = False
        if catch_up_rows is not None and int(catch_up_rows) < 1:
            raise ValueError(f"catch_up_rows must be >= 1 or None, got {catch_up_rows}")
        # the newest unseen rows a proposal injects (None: all)
        self.catch_up_rows = None if catch_up_rows is None else int(catch_up_rows)
        self.skipped_rows = 0  # committed rows never injected (the bound, or before a gap)
        # commits not yet injected: (tokens, rows [n, F] or None, start_pos), contiguous. They are
        # injected in one call when the next proposal needs them, so while the cost governor
        # parks drafting the per-token commit costs nothing, and a probe after N parked steps
        # injects N rows at once instead of N one-row calls.
        self._pending: list[tuple[list[int], Any, int]] = []

    def propose(self, ctx: DraftContext) -> list[int]:
        count = min(self.max_draft_tokens, int(ctx.max_tokens))
        if count <= 0:
            return []
        self._flush()
        carry = ctx.carry_hidden if self._row_ok(ctx.carry_hidden) else None
        tokens, confidences = self.head.draft_block(ctx.last_token, carry, ctx.position, count)
        confidences = [float(c) for c in list(confidences)[:count]]
        return gate_cumulative(list(tokens)[:count], confidences, self.min_draft_prob)

    def commit(self, tokens: Sequence[int], hidden_rows: Any, start_pos: int) -> None:
        if hidden_rows is not None and not self._row_ok(hidden_rows):
            hidden_rows = None  # the drafter forgets those positions rather than read wrong rows
        tokens, start = list(tokens), int(start_pos)
        if not tokens:
            return
        if self._pending:
            last_tokens, last_rows, last_start = self._pending[-1]
            end = last_start + len(last_tokens)
            if self.catch_up_rows is not None and start > end:
                # a gap in the commits: what came before it is older than
                # the newest catch_up_rows rows the next proposal injects; dropped unseen
                self.skipped_rows += sum(len(part[0]) for part in self._pending)
                self._pending = []
            elif not (end == start and (last_rows is None) == (hidden_rows is None)):
                self._flush()
        self._pending.append((tokens, hidden_rows, start))

    def _flush(self) -> None:
        """Inject the pending commits (one catch-up call per run of rows, or of None), the
        newest ``catch_up_rows`` of a run of rows only."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        import torch
        limit = self.catch_up_rows
        if limit is not None and pending[0][1] is not None:
            total = sum(len(part[0]) for part in pending)
            if total > limit:  # keep the newest rows: drop whole old parts, then cut the first
                drop = total - limit
                self.skipped_rows += drop
                while drop >= len(pending[0][0]):
                    drop -= len(pending.pop(0)[0])
                if drop:
                    tokens, rows, start = pending[0]
                    pending[0] = (tokens[drop:], rows[drop:], start + drop)
        tokens = [t for part in pending for t in part[0]]
        rows = None if pending[0][1] is None else (
            pending[0][1] if len(pending) == 1 else torch.cat([part[1] for part in pending], dim=0))
        self.head.draft_catch_up(tokens, rows, pending[0][2])

    def reset(self) -> None:
        self._pending = []
        self.head.reset()

    def close(self) -> None:
        """The sequence is over: a view this speculator owns frees its context (its ``close``);
        a shared head is reset, as before views existed."""
        self._pending = []
        release = getattr(self.head, "close", None) if self.owns_head else None
        if callable(release):
            release()
        else:
            self.head.reset()

    def _row_ok(self, rows: Any) -> bool:
        """Rows of the width the head reads; a mismatch is logged once and the rows ignored."""
        if rows is None:
            return False
        if self.feature_size is None or rows.shape[-1] == self.feature_size:
            return True
        if not self._warned:
            self._warned = True
            log.warning("block speculator: hidden rows are %d wide, the drafter reads %d; ignoring them",
                        rows.shape[-1], self.feature_size)
        return False


def _attach_from_options(target: Any, options: Any) -> Any:
    """The block head the operator named with --draft-model, attached now (a clear decline if not)."""
    path = getattr(options, "drafter_path", None) if options is not None else None
    if not path:
        kind = getattr(getattr(getattr(target, "draft_head", None), "kind", None), "value", None)
        found = f" (it carries a {kind} head; --spec-type draft-head serves that)" if kind and kind != "none" else ""
        raise SpeculatorDeclined(
            f"the model carries no block drafter{found}; attach a DFlash file with --draft-model PATH "
            "or use the weight-free --spec-type ngram"
        )
    from tsspec.errors import ModelLoadError

    from .attach import attach_dflash
    from .config import ARCHITECTURES

    try:
        from tsspec_gguf.gguf_file import read_architecture

        arch = read_architecture(path)
        if arch not in ARCHITECTURES:
            raise SpeculatorDeclined(f"{path} is a {arch!r} file; the block plugin attaches DFlash drafters")
        return attach_dflash(target, path, options)
    except ModelLoadError as exc:
        raise SpeculatorDeclined(str(exc)) from None


def make_block_speculator(target: Any, options: Any = None) -> BlockDraftSpeculator:
    """A BlockDraftSpeculator over the target's BLOCK head, or SpeculatorDeclined saying why not."""
    head = getattr(target, "draft_head", None)
    if head is None or getattr(head, "kind", None) is not DraftHeadKind.BLOCK:
        head = _attach_from_options(target, options)
    if not callable(getattr(head, "draft_block", None)):
        raise SpeculatorDeclined("the attached block head has no draft_block")
    feature_size = getattr(head, "feature_size", None)
    if feature_size is not None:
        require_feature_width(target, feature_size, "the block drafter", "its feature taps are not set")
    # the gate: the registry sets min_draft_prob to --spec-pmin, else default_min_draft_prob
    pmin = options.pmin if options is not None and options.pmin is not None else DEFAULT_MIN_DRAFT_PROB
    # a head that offers per-sequence views gets one per speculator: sequences served at once
    # each keep their own context over the shared weights
    make_view = getattr(head, "for_sequence", None)
    view = make_view() if callable(make_view) else head
    # the block size is this algorithm's own limit; the loop narrows it to the sequence's window
    return BlockDraftSpeculator(view, window=int(head.block_size), min_draft_prob=pmin, feature_size=feature_size,
                                owns_head=view is not head, catch_up_rows=context_rows(head))


def context_rows(head: Any) -> int:
    """The newest committed rows a proposal of ``head`` needs: its sliding window when every
    layer slides (no row older than that is attended: the bound changes no draft), else
    ``DEFAULT_CATCH_UP_ROWS``."""
    config = getattr(head, "config", None)
    window = getattr(config, "sliding_window", None)
    layers = int(getattr(config, "num_layers", 0) or 0)
    sliding = getattr(config, "layer_is_sliding", None)
    if window and layers and callable(sliding) and all(sliding(i) for i in range(layers)):
        return int(window)
    return DEFAULT_CATCH_UP_ROWS
