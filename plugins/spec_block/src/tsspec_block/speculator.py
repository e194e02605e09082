"""BlockDraftSpeculator: the ``block`` algorithm over any BLOCK draft head (DFlash, DFlash2, DSpark).

One drafter pass proposes a whole window; the confidence gate keeps the longest prefix whose
CUMULATIVE probability (the product of the per-token confidences) stays at or above
``min_draft_prob`` (``--spec-pmin``, default 0.35: far stricter than the same number on a
per-token head, which gates each token alone). Example, pmin 0.35, confidences
``[0.9, 0.8, 0.6, 0.95]``: products 0.9, 0.72, 0.432, 0.41 -> all four kept; with a fifth
confidence of 0.5 the product falls to 0.205 and the fifth draft is dropped.

Draft only what pays (``prefix_value.PrefixValue``; on when the target publishes its forward
cost by rows, ``spec_verify_row_ms``, the cost governor is on and ``TS_BLOCK_VALUE`` is not 0): of the gated prefix, the
speculator proposes the length whose expected landing (the confidences calibrated online by
what each verify kept) buys the most tokens per unit of verify cost, none when a plain step is
worth more. A head that scores rows lazily (``scores_rows_lazily``) scores row 1 first and the
rest only when a longer prefix could pay. The calibration is the drafter's: one per head,
shared by its sequences. A pass itself must pay too: each is charged its milliseconds over a
plain step's (the median of the loop's recent plain steps, ``observe_step``) and credited its
prefix's expected gain; while the drafter's running mean is negative the speculator runs no
pass for 1, 2, 4 .. ``MAX_SKIP`` (512, the cost governor's longest park) steps between tries
(those steps propose nothing), so a drafter that is rarely sure stays out of the way and one
that starts to pay comes back. The backoff, the skips a sequence left untaken and the recent
plain steps that price a pass are the drafter's (kept with its calibration): a new sequence
resumes them, instead of opening with two passes (the first unjudged: no plain step timed yet)
and a catch-up of the prompt's last rows. A skipped step is cheap, not free: the loop still
asks, commits and has the target copy its feature rows, and it looks free to the governor
(which therefore does not park it); a pass with its catch-up costs a good part of a plain step on
the shipped SmolLM2 drafter, hence the long backoff.

The proposals stay unkeyed lists (no ``Proposal(confidence=...)``, and ``DraftContext.worth``
is not read): the runtime's confidence-sized drafting does not park on zero-accept streaks,
which is how a losing block drafter gets out of the way (``test_generation``'s parked-drafter
test); pointing ``PrefixValue``'s two calls (``length``, ``worth_more``) at ``ctx.worth`` is
left until that is settled.

Bounded catch-up: a proposal catches the head up on at most the newest ``catch_up_rows``
committed rows it has not seen (``DEFAULT_CATCH_UP_ROWS``, or the drafter's sliding window when
every layer slides: then the bound changes no draft). The first proposal of a sequence thus
injects the prompt's last rows, not the whole prompt, and a probe after a park its last rows,
whatever the park's length. The loop reads the same number (the speculator's ``catch_up_rows``)
to withhold a parked speculator's commits until that many steps before the next probe; rows
committed before such a gap are dropped unseen, as the bound would have dropped them had every
commit come, so the drafts are the same either way. Output never changes (verification decides).

The head owns the drafter's context (a sliding KV ring fed by every commit); the factory takes a
per-sequence view of it when the head offers one (``for_sequence``), so sequences served at once
do not share a context. The speculator survives a reused KV prefix: the ring refills from the
freshly forwarded suffix (``can_arm_after_prefix_reuse``).
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Sequence

from tsspec.protocols import DraftContext, DraftHeadKind, SpeculatorDeclined, require_feature_width

from .prefix_value import Calibration, PrefixValue, shape_ratios

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
MAX_SKIP = 512  # the longest run of steps without a pass while passes do not pay (then one is tried)
VALUE_ENV = "TS_BLOCK_VALUE"  # "0": propose the gated prefix whole (no expected-value cut)
DESCRIPTION = (
    "block drafter (DFlash / DFlash2 / DSpark): one drafter pass proposes a whole window, gated "
    "on the cumulative prefix probability"
)
DRAFTER_HINT = "a DFlash drafter file (--draft-model PATH)"


def gate_cumulative(tokens: Sequence[int], confidences: Sequence[float], pmin: float) -> list[int]:
    """The longest prefix of ``tokens`` whose running product of confidences stays >= pmin.

    >>> gate_cumulative([1, 2, 3], [0.9, 0.5, 0.9], 0.4)
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
                 catch_up_rows: int | None = DEFAULT_CATCH_UP_ROWS, value: PrefixValue | None = None):
        self.head = head
        # the prefix worth verifying by expected landing against the verify rows' cost (None:
        # the confidence gate alone); it learns from what each verified proposal landed
        self.value = value
        self._lazy = bool(getattr(head, "scores_rows_lazily", False))
        self._proposed: tuple[int, list[float]] | None = None  # (position, confidences) awaiting its verify
        self.declined_drafts = 0  # proposals the value rule cut to nothing (the loop adds them to its stats)
        self.skipped_passes = 0  # steps that ran no pass because passes did not pay
        self._skip_left = 0  # steps to skip before the next pass (the next skip's length is the drafter's)
        # head is a per-sequence view made for this speculator (for_sequence): close frees it
        self.owns_head = bool(owns_head)
        self.max_draft_tokens = max(0, min(int(window), int(head.block_size) - 1))
        self.min_draft_prob = float(min_draft_prob)
        self.feature_size = feature_size  # expected width of the hidden rows, when known
        self._warned = False
        if catch_up_rows is not None and int(catch_up_rows) < 1:
            raise ValueError(f"catch_up_rows must be >= 1 or None, got {catch_up_rows}")
        # the newest unseen rows a proposal injects (None: all); the loop reads it too
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
        self._proposed = None
        value = self.value
        if value is not None and self._skip_left > 0:  # passes do not pay: this step runs none
            self._skip_left -= 1
            self.skipped_passes += 1
            return []
        self._flush()  # the catch-up is not the pass's cost: a long skip would price every retry out
        start = time.perf_counter()
        carry = ctx.carry_hidden if self._row_ok(ctx.carry_hidden) else None
        more = None
        if self._lazy and value is not None:
            more = lambda first: value.worth_more(first, count)  # noqa: E731
        if more is not None:
            tokens, confidences = self.head.draft_block(ctx.last_token, carry, ctx.position, count, more=more)
        else:
            tokens, confidences = self.head.draft_block(ctx.last_token, carry, ctx.position, count)
        confidences = [float(c) for c in list(confidences)[:count]]
        kept = gate_cumulative(list(tokens)[:count], confidences, self.min_draft_prob)
        length = len(kept)
        if kept and value is not None:
            length = value.length(confidences[:length])
        if kept and length == 0:
            self.declined_drafts += 1
        kept = kept[:length]
        if value is not None:
            self._judge_pass(value, confidences, length, (time.perf_counter() - start) * 1000.0)
        if kept:
            self._proposed = (int(ctx.position), confidences[: len(kept)])
        return kept

    def _judge_pass(self, value: PrefixValue, confidences: list[float], length: int, pass_ms: float) -> None:
        """Credit the pass what its prefix is expected to earn, charge it its milliseconds over
        a plain step's (once a plain step was timed), and skip the next passes while the
        drafter's passes do not pay: 1, 2, 4 .. ``MAX_SKIP`` steps, reset once they do. The
        backoff lives with the calibration (the drafter's), so the next sequence on this
        drafter skips as long after its first judged pass as the last one did."""
        cal = value.calibration
        plain = cal.plain_step_ms()  # the target's recent plain steps, this sequence's or earlier ones'
        if plain <= 0.0:
            return  # nothing to price the pass against yet (or a clock that does not move)
        cal.note_pass(value.pass_gain(confidences, length, pass_ms / plain))
        if value.passes_pay():
            cal.skip_next = 1
        else:  # the backoff is the drafter's: a new sequence on it resumes it
            self._skip_left = cal.skip_next
            cal.skip_next = min(MAX_SKIP, 2 * cal.skip_next)

    def observe_step(self, speculative: bool, ms: float, tokens: int, drafted: int) -> None:
        """The loop's report of each step: plain steps' milliseconds price a pass (kept with the
        calibration: the next sequence's first pass is priced by them too)."""
        if not speculative and ms > 0 and self.value is not None:
            self.value.calibration.note_plain(ms)

    def commit(self, tokens: Sequence[int], hidden_rows: Any, start_pos: int) -> None:
        if self._proposed is not None:  # the verify of the last proposal: what landed of it
            position, confidences = self._proposed
            self._proposed = None
            if int(start_pos) == position and tokens and self.value is not None:
                self.value.record(confidences, min(len(tokens) - 1, len(confidences)))
        if hidden_rows is not None and not self._row_ok(hidden_rows):
            hidden_rows = None  # the drafter forgets those positions rather than read wrong rows
        tokens, start = list(tokens), int(start_pos)
        if not tokens:
            return
        if self._pending:
            last_tokens, last_rows, last_start = self._pending[-1]
            end = last_start + len(last_tokens)
            if self.catch_up_rows is not None and start > end:
                # a gap (the loop withheld a park's commits): what came before it is older than
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
        self._proposed = None
        # the skips the drafter's last sequence left untaken come first: passes that did not pay
        # there are not retried at once because a new sequence began; this sequence takes them
        # (a sequence that ends without ``close`` leaves none behind for the next)
        self._skip_left = 0
        if self.value is not None:
            self._skip_left, self.value.calibration.skip_left = self.value.calibration.skip_left, 0
        self.head.reset()

    def close(self) -> None:
        """The sequence is over: a view this speculator owns frees its context (its ``close``);
        a shared head is reset, as before views existed. The skips still to go are left with
        the calibration for the drafter's next sequence."""
        if self.value is not None:
            self.value.calibration.skip_left = self._skip_left
        self._pending = []
        self._proposed = None
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
                                owns_head=view is not head, catch_up_rows=context_rows(head),
                                value=prefix_value_for(target, head) if _governed(options) else None)


def _governed(options: Any) -> bool:
    """Is the cost governor on (``--spec-adaptive``, the default)? The value rule and the pass
    backoff are cost governance (timed, shared by the drafter's sequences): with the governor
    off the gate alone decides, and a sequence drafts the same alone or beside others."""
    return options is None or getattr(options, "adaptive", True) is not False


# one calibration per drafter head, kept while the head lives: what its confidences are worth is
# the drafter's (and the target's), not one sequence's
_CALIBRATIONS: "weakref.WeakKeyDictionary[Any, Calibration]" = weakref.WeakKeyDictionary()


def prefix_value_for(target: Any, head: Any) -> PrefixValue | None:
    """The value rule for ``head`` on ``target``: None when the target publishes no cost by
    rows (``spec_verify_row_ms``) or the value rule is switched off (``VALUE_ENV``)."""
    from tsspec.switches import switch_on

    if not switch_on(VALUE_ENV):
        return None
    try:
        ratios = shape_ratios(getattr(target, "spec_verify_row_ms", None), int(head.block_size))
    except Exception:  # a target's optional measurement that fails: no value rule
        ratios = None
    if ratios is None:
        return None
    try:
        calibration = _CALIBRATIONS.get(head)
        if calibration is None:
            calibration = _CALIBRATIONS[head] = Calibration()
    except TypeError:  # a head that cannot be weakly referenced: a calibration per sequence
        calibration = Calibration()
    return PrefixValue(ratios, calibration)


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
