"""DraftHeadSpeculator: the per-token learned-drafter algorithm (NextN / MTP, EAGLE-shaped).

Propose chains the head one token at a time: step k feeds the previous draft token with the
head's own hidden output, so a window of K drafts costs up to K head calls. Each token's
confidence is the head's top-1 probability over its top-10 logits, after the sampler's logit
adjustments. The chain stops at the first token under the gate ``min_draft_prob``
(``--spec-pmin``, else the drafter file's recommendation), at ``chain_limit`` (the file's
recommended chain, unless ``--spec-draft`` is given) or at the window. The proposal carries the
confidences (``tsspec.Proposal(confidence=)``), so the loop's cost governor verifies the length
its run's calibration says pays, possibly none.

Commit tells the head what really landed, with the trunk's exact hidden rows, so its KV cache
tracks the sequence and not its own rejected drafts. Like llama.cpp, which runs its MTP block
once over ``n_accepted + 1`` rows, we fold that catch-up into the next proposal's first head
call when the head offers ``draft_catch_up_and_step``: commit
only records the rows, and the next proposal's first step carries them (its own inputs are
``ctx.last_token`` and ``ctx.carry_hidden``). A step then costs one head call instead of two.
``TS_MTP_FOLD_CATCHUP=0`` keeps the unfolded path (catch-up at commit), for attribution.

The catch-up is bounded: while the cost governor parks drafting, plain steps keep committing and
the pending rows would grow with the park (a head row costs about a quarter of a millisecond on
the embedded model's CPU path, so a 500-step park would make the next probe pay ~130 ms). Only
the newest ``catch_up_rows`` pending rows are kept; the head sees a gap before them and restarts
its cache there (every per-token head restarts on a catch-up that starts past its end). A probe
after a park then costs a bounded catch-up whatever the park's length; the drafts after it see
less context, the output never changes (verification decides). Pending rows before a gap in the
commits are dropped unseen (the bound would have dropped them had every commit come). On the
unfolded path each commit reaches the head at once, so the head keeps its whole context through
a park. The bound applies to any commit the head has not
yet seen, the prompt's at prefill included: the first proposal of a sequence sees the prompt's
last ``catch_up_rows`` rows only. After a reused KV prefix (the prefill commits only the
prompt's new part, its first row zeros: the loop lacks that row's predecessor) the zero row is
not fed, so a head that resumes after a gap drafts from the same newest rows as without the
reuse whenever the new part is longer than ``catch_up_rows``.

The gate on compact logits: a head that offers ``draft_vocab_ids`` (a NextN drafter file's draft
vocabulary, ascending ids) returns logits over those K ids only when asked (``compact=True``),
and the gate runs on them: no vocabulary-sized vector is built. This is exact, not an
approximation: the full-vocabulary logits of such a head are -inf outside its ids, so their
top-10 (softmax over it) and argmax (ties to the lowest id; the ids ascend) are the compact
ones'. It applies when the sampler's adjustments cannot change the logits: no
``adjust_logits``, or one that reads no preceding token (``adjust_lookback == 0``: the runtime's
only adjustment is the repetition penalty, off then). With a penalty the compact logits are
spread into the [vocab] vector, adjusted, and gated as before. Ids at or past the context's
``vocab_size`` (a padded vocabulary) are never proposed in either form. Where the gate runs on
compact logits and the head offers ``draft_gated`` (NextN drafter files do), the head call and
the gate are one call that returns the top-1 and its probability (the same values; on the
compiled kernels one native call that makes no tensor).

Worked example (window 3, folding on). Prefill commits tokens [a, b, c] at 0 with rows
[0, h_a, h_b]; the head is NOT called. propose(last=d, position=3, carry=h_c) makes one fused call
over [a, b, c, d] with rows [0, h_a, h_b, h_c] from 0 -> logits for position 4 -> draft e; then
draft_step(e, h_out, 4) -> f; draft_step(f, h_out', 5) -> g. The trunk accepts e only and emits
x: commit([d, e], [h_c, h_d], 3) is recorded; propose(last=x, position=5, carry=h_e) makes one
fused call over [d, e, x] from 3, which overwrites the head's rows for the rejected f and g.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import attrs
import torch

from tsspec import Proposal
from tsspec.switches import switch_on

from .confidence import passes_gate, top1_over_topk
from .plugin import ALGORITHM

DEFAULT_MIN_DRAFT_PROB = 0.75  # --spec-pmin for a per-token head (registered with the algorithm)
DEFAULT_CATCH_UP_ROWS = 8  # newest pending rows a catch-up carries after a park (None: all)
FOLD_ENV = "TS_MTP_FOLD_CATCHUP"
PENDING_ROOM = 16  # rows a pending buffer starts with (the bound's 8, a verify's rows, the proposal's)


def fold_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TS_MTP_FOLD_CATCHUP`` allows folding (anything but 0/false/no/off does)."""
    return switch_on(FOLD_ENV, environ)


@attrs.define
class HeadCallCounters:
    """How the speculator used its head: the phase counters for the fold benchmark.

    ``head_calls`` = ``steps + catch_ups + fused``; with folding ``catch_ups`` stays 0 except
    where a gap or a skipped proposal forces one.
    """

    proposals: int = 0  # propose() calls that reached the head
    steps: int = 0  # draft_step calls
    catch_ups: int = 0  # draft_catch_up calls
    fused: int = 0  # draft_catch_up_and_step calls
    drafted: int = 0  # tokens proposed
    gate_stops: int = 0  # chains ended by the confidence gate
    skipped_rows: int = 0  # committed rows never shown to the head (bounded catch-up)

    @property
    def head_calls(self) -> int:
        return self.steps + self.catch_ups + self.fused


class _Pending:
    """Committed rows not yet shown to the head (folding on): contiguous from ``start``.

    The rows live in a buffer of their own (a copy: the target may reuse its output buffer),
    one after another from row ``_lo``, so the fused head call reads them in place instead of a
    stack made per proposal: ``leading()`` with the proposal's own row passed apart (a head's
    ``draft_gated``), or ``rows_with`` it, written into the room kept for one more row. A buffer
    is never reused by another ``_Pending``, so a head that keeps the rows it was handed keeps
    what it saw."""

    def __init__(self, start: int, tokens: list[int], rows: torch.Tensor):
        self.start = int(start)
        self.tokens = tokens
        n = len(tokens)
        self._buf = torch.empty(max(2 * n + 2, PENDING_ROOM), rows.shape[1], dtype=rows.dtype)  # [cap, F]
        self._buf[:n].copy_(rows[:n])
        self._lo = 0  # buffer row of the first pending row

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def rows(self) -> torch.Tensor:
        """[n, F]: the pending rows (a view of the buffer)."""
        return self._buf[self._lo : self._lo + len(self.tokens)]

    def leading(self) -> torch.Tensor:
        """[>= n, F]: rows whose first n are the pending rows (the buffer itself when they start
        at its first row: no view is made)."""
        return self._buf if self._lo == 0 else self._buf[self._lo :]

    def rows_with(self, last: torch.Tensor) -> torch.Tensor:
        """[n + 1, F]: the pending rows and ``last`` ([F], written into the room kept for it)."""
        lo, n = self._lo, len(self.tokens)
        self._buf[lo + n].copy_(last.reshape(-1))
        return self._buf[lo : lo + n + 1]

    def _room(self, more: int) -> None:
        """Room for ``more`` rows after the last, and one spare (``rows_with``)."""
        n, lo, cap = len(self.tokens), self._lo, self._buf.shape[0]
        if lo + n + more + 1 <= cap:
            return
        if n + more + 1 <= cap // 2:  # the dropped rows' room: move the rows down
            self._buf[:n] = self._buf[lo : lo + n].clone()
        else:
            grown = torch.empty(2 * (n + more + 1), self._buf.shape[1], dtype=self._buf.dtype)  # [cap', F]
            grown[:n] = self._buf[lo : lo + n]
            self._buf = grown
        self._lo = 0

    def append(self, token: int, row: torch.Tensor) -> None:
        """One more row [F] at the end."""
        self._room(1)
        self._buf[self._lo + len(self.tokens)].copy_(row)
        self.tokens.append(token)

    def replace_from(self, keep: int, tokens: list[int], rows: torch.Tensor) -> None:
        """Keep the first ``keep`` rows; ``tokens`` and their ``rows`` [m, F] follow them."""
        del self.tokens[keep:]
        self._room(len(tokens))
        at = self._lo + keep
        self._buf[at : at + len(tokens)].copy_(rows[: len(tokens)])
        self.tokens.extend(tokens)

    def drop(self, count: int) -> None:
        """Forget the oldest ``count`` rows."""
        del self.tokens[:count]
        self._lo += count
        self.start += count


class DraftHeadSpeculator:
    """Speculator over a per-token DraftHead (kind PER_TOKEN).

    ``feature_size`` is the width of the trunk's hidden rows (used for a missing row, which the
    commit contract allows only for position 0). ``owns_head``: ``head`` is a per-sequence view
    made for this speculator alone (``for_sequence``); ``close`` then frees the view's sequence
    state (its ``close``). A shared head is never closed by a speculator.
    """

    name = ALGORITHM
    default_min_draft_prob = DEFAULT_MIN_DRAFT_PROB
    needs_hidden_state = True
    handles_own_prefill = False

    def __init__(
        self,
        head,
        *,
        max_draft_tokens: int,
        feature_size: int,
        min_draft_prob: float | None = None,
        fold_catch_up: bool | None = None,
        catch_up_rows: int | None = DEFAULT_CATCH_UP_ROWS,
        owns_head: bool = False,
        chain_limit: int | None = None,
    ) -> None:
        if max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, got {max_draft_tokens}")
        self.head = head
        self.owns_head = bool(owns_head)
        self.max_draft_tokens = int(max_draft_tokens)
        self.feature_size = int(feature_size)
        self.min_draft_prob = float(
            DEFAULT_MIN_DRAFT_PROB if min_draft_prob is None else min_draft_prob
        )
        # the longest chain (a drafter file's recommendation; None: none)
        self.chain_limit = None if chain_limit is None else max(1, int(chain_limit))
        # a per-position head chained token by token drafts garbage after a gap it never saw
        self.can_arm_after_prefix_reuse = bool(getattr(head, "resumes_after_gap", False))
        wants_fold = fold_enabled() if fold_catch_up is None else bool(fold_catch_up)
        self.fold_catch_up = wants_fold and callable(getattr(head, "draft_catch_up_and_step", None))
        if catch_up_rows is not None and int(catch_up_rows) < 1:
            raise ValueError(f"catch_up_rows must be >= 1 or None, got {catch_up_rows}")
        self._keep_rows = None if catch_up_rows is None else int(catch_up_rows)  # the pending rows kept
        self.counters = HeadCallCounters()
        self._pending: _Pending | None = None
        self._fresh = True  # no commit since the sequence began (see commit)
        ids = getattr(head, "draft_vocab_ids", None)  # [K] ascending target ids, or None
        self._draft_ids = None if ids is None else ids.reshape(-1).to(torch.long)
        self._draft_list = None if ids is None else self._draft_ids.tolist()  # index -> id, no tensor op
        # the head runs the gate itself (draft_gated: head call and gate in one, see _gate_cut)
        self._gated = ids is not None and callable(getattr(head, "draft_gated", None))
        self._cut = (None, 0)  # (vocab_size, how many draft ids lie under it), cached

    # -- proposing ---------------------------------------------------------------------------
    def propose(self, ctx) -> list[int]:
        budget = min(self.max_draft_tokens, int(ctx.max_tokens))
        if budget < 1 or ctx.carry_hidden is None:
            return []
        self.counters.proposals += 1
        compact = self._draft_ids is not None
        budget = min(budget, self.chain_limit or budget)
        cut = self._gate_cut(ctx, compact)
        scores, hidden = self._first_step(ctx.last_token, ctx.carry_hidden, ctx.position, compact, cut)
        drafts: list[int] = []
        confidence: list[float] = []
        while True:
            token, probability = scores if cut else self._gate(scores, ctx, drafts, compact)
            if token is None or not self._keeps(probability):
                self.counters.gate_stops += 1
                break
            drafts.append(token)
            confidence.append(probability)
            if len(drafts) == budget:
                break
            scores, hidden = self._step(token, hidden, ctx.position + len(drafts), compact, cut)
        self.counters.drafted += len(drafts)
        return Proposal(drafts, confidence=confidence) if drafts else drafts

    def _keeps(self, probability: float) -> bool:
        """Whether the chain takes a token of this ``probability``: the gate (a NaN fails it)."""
        return passes_gate(probability, self.min_draft_prob)

    def _gate(self, logits: torch.Tensor, ctx, drafts: list[int], compact: bool) -> tuple[int | None, float]:
        """(top-1 token, its probability over the top-10) after the sampler's adjustments;
        ``logits`` [K] over the head's draft ids when ``compact``, else [vocab]. (None, 0.0)
        when no draft id lies inside the context's vocabulary."""
        logits = logits.reshape(-1)
        adjusts = ctx.adjust_logits is not None and ctx.adjust_lookback != 0
        if compact and not adjusts:
            cut = self._ids_under(ctx.vocab_size)
            if cut == 0:
                return None, 0.0
            index, probability = top1_over_topk(logits[:cut])  # [cut]: ids ascend
            return int(self._draft_ids[index]), probability
        if compact:  # spread over the vocabulary for the adjustment, as a full-vocabulary head gives
            size = int(getattr(self.head, "vocab_size", 0) or ctx.vocab_size or int(self._draft_ids.max()) + 1)
            full = torch.full((size,), float("-inf"))  # [vocab]
            full.index_copy_(0, self._draft_ids, logits)
            logits = full  # [vocab]
        if ctx.vocab_size and logits.shape[0] > ctx.vocab_size:
            logits = logits[: ctx.vocab_size]  # padded head vocabulary: never draft padding
        if ctx.adjust_logits is not None:
            logits = ctx.adjust_logits(logits, ctx.preceding(drafts))  # no copy of history
        return top1_over_topk(logits)

    def _gate_cut(self, ctx, compact: bool) -> int:
        """How many draft ids the gate reads when the head runs it (``draft_gated``: the head
        call and the gate in one, the same (token, probability) as ``_gate`` on its compact
        logits); 0 where ``_gate`` runs: a head without ``draft_gated``, full-vocabulary
        logits, a sampler adjustment to apply, or no draft id under the vocabulary."""
        if not (compact and self._gated) or (ctx.adjust_logits is not None and ctx.adjust_lookback != 0):
            return 0
        return self._ids_under(ctx.vocab_size)

    def _ids_under(self, vocab_size: int) -> int:
        """How many of the (ascending) draft ids lie under ``vocab_size`` (0: no limit)."""
        if self._cut[0] != vocab_size:
            ids = self._draft_ids
            count = ids.numel() if not vocab_size else int(torch.searchsorted(ids, int(vocab_size)))
            self._cut = (vocab_size, count)
        return self._cut[1]

    def _first_step(self, token: int, h_prev: torch.Tensor, position: int, compact: bool = False, cut: int = 0):
        """The chain's first head call; with folding it also carries the pending catch-up.
        Returns (logits, hidden), or ((token, probability), hidden) with a ``cut`` (the gate
        run by the head, ``_gate_cut``)."""
        pending = self._pending
        if pending is not None and not (self.fold_catch_up and pending.end == position):
            self._flush()  # unfolded, or pending rows that do not lead up to `position`
            pending = None
        if pending is None:
            return self._step(token, h_prev, position, compact, cut)
        self.counters.fused += 1
        tokens = [*pending.tokens, int(token)]
        if cut:  # the pending rows read in place, h_prev after them
            index, probability, hidden = self.head.draft_gated(tokens, pending.leading(), pending.start, cut,
                                                               last=h_prev)
            self._pending = None  # only once the head has them: a failed call is retried whole
            return (self._draft_list[index], probability), hidden
        rows = pending.rows_with(h_prev)  # [n + 1, F]
        if compact:
            out = self.head.draft_catch_up_and_step(tokens, rows, pending.start, compact=True)
        else:
            out = self.head.draft_catch_up_and_step(tokens, rows, pending.start)
        self._pending = None  # only once the head has them: a failed call is retried whole
        return out

    def _step(self, token: int, h_prev: torch.Tensor, position: int, compact: bool = False, cut: int = 0):
        self.counters.steps += 1
        if cut:
            index, probability, hidden = self.head.draft_gated([int(token)], None, position, cut, last=h_prev)
            return (self._draft_list[index], probability), hidden
        if compact:
            return self.head.draft_step(int(token), h_prev, position, compact=True)
        return self.head.draft_step(int(token), h_prev, position)

    # -- committing --------------------------------------------------------------------------
    def commit(self, tokens: Sequence[int], hidden_rows: torch.Tensor | None, start_pos: int) -> None:
        """Record what landed. Rows are the trunk rows that predicted each token (zeros at
        position 0); without rows (a runtime that skipped them) zeros stand in, which only
        costs acceptance."""
        pending = self._pending
        if (len(tokens) == 1 and pending is not None and hidden_rows is not None and self.fold_catch_up
                and start_pos == pending.end and hidden_rows.shape[0] >= 1):
            # the common commit (every plain step, parked or not): one row appended, kept lean
            # as it runs after every forward (a copy: the target may reuse its output buffer)
            pending.append(int(tokens[0]), hidden_rows[0])  # [F]
            limit = self._keep_rows
            if limit is not None and len(pending.tokens) > limit:
                pending.drop(1)
                self.counters.skipped_rows += 1
            return
        tokens = [int(t) for t in tokens]
        if not tokens:
            return
        if hidden_rows is None:
            hidden_rows = torch.zeros(len(tokens), self.feature_size)
        if hidden_rows.shape[0] < len(tokens):
            raise ValueError(f"{len(tokens)} tokens but only {hidden_rows.shape[0]} hidden rows")
        hidden_rows = hidden_rows[: len(tokens)]  # [n, F]
        fresh, self._fresh = self._fresh, False
        if fresh and start_pos > 0 and not bool(torch.any(hidden_rows[0])):
            # a prefill after a reused KV prefix: its first row's predecessor is a row the loop
            # does not have (zeros). Not fed: the head starts one position later, as it skips
            # position 0 of a whole prompt
            tokens, hidden_rows, start_pos = tokens[1:], hidden_rows[1:], int(start_pos) + 1
            self.counters.skipped_rows += 1
            if not tokens:
                return
        if not self.fold_catch_up:
            limit = self._keep_rows
            if limit is not None and len(tokens) > limit:  # the same bound as the folded path
                drop = len(tokens) - limit
                tokens, hidden_rows, start_pos = tokens[drop:], hidden_rows[drop:], int(start_pos) + drop
                self.counters.skipped_rows += drop
            self.counters.catch_ups += 1
            self.head.draft_catch_up(tokens, hidden_rows, int(start_pos))
            return
        pending, limit = self._pending, self._keep_rows
        if pending is not None and limit is not None and start_pos > pending.end:
            # a gap in the commits (up to the newest catch_up_rows): the
            # rows before it are older than any the bound keeps, and the head restarts at a gap
            # anyway; dropped unseen, as the bound would have dropped them had every commit come
            self.counters.skipped_rows += len(pending.tokens)
            pending = self._pending = None
        if pending is not None and not pending.start <= start_pos <= pending.end:
            self._flush()  # a gap: catch up on what we had, then start again
            pending = None
        if limit is not None and len(tokens) > limit:
            # the bound keeps the newest rows, all of them this commit's: the older ones are
            # skipped without a copy, and so are the pending rows before them
            drop = len(tokens) - limit
            if pending is not None:
                self.counters.skipped_rows += start_pos - pending.start
                pending = self._pending = None
            tokens, hidden_rows, start_pos = tokens[drop:], hidden_rows[drop:], int(start_pos) + drop
            self.counters.skipped_rows += drop
        # kept until the next proposal: copied into the pending buffer (the target may reuse
        # its output buffer)
        rows = hidden_rows.detach()  # [n, F]
        if pending is not None:
            pending.replace_from(start_pos - pending.start, tokens, rows)  # overlap: the newer rows win
        else:
            self._pending = _Pending(int(start_pos), tokens, rows)
        self._bound()

    def _bound(self) -> None:
        """Keep only the newest ``catch_up_rows`` pending rows (the older ones are skipped)."""
        pending, limit = self._pending, self._keep_rows
        if pending is None or limit is None or len(pending.tokens) <= limit:
            return
        drop = len(pending.tokens) - limit
        pending.drop(drop)
        self.counters.skipped_rows += drop

    def _flush(self) -> None:
        """Catch the head up on the pending rows with a call of its own."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        self.counters.catch_ups += 1
        self.head.draft_catch_up(pending.tokens, pending.rows, pending.start)

    # -- lifecycle ---------------------------------------------------------------------------
    def reset(self) -> None:
        """A new sequence: drop pending rows and the head's cache (counters survive)."""
        self._pending = None
        self._fresh = True
        self.head.reset()

    def close(self) -> None:
        """The sequence is over: drop pending rows and free the head view's state (if this
        speculator owns the view; it regrows if the speculator is used again)."""
        self._pending = None
        release = getattr(self.head, "close", None) if self.owns_head else None
        if callable(release):
            release()
