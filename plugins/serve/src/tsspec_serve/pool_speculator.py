"""``ngram-pool``: weight-free drafting from the request's own tokens and a cross-request pool.

Each step it looks for the longest suffix of the sequence (8 down to 2 tokens) that occurred
earlier in the same sequence and would copy what followed (prompt lookup), and asks the
server's ``DraftPool`` (``memory.py``) for the token that most often followed the longest suffix
(8 down to 3 tokens) in earlier requests. The longer match drafts (the request's own on a tie):
a copy of its own text (a plain list, verified whole like ``ngram``'s), or a chain of pool
followers, each read with the drafts before it as context, proposed with each token's share of
its entry's count as its confidence, so the loop verifies the prefix that pays by what it
measures of those confidences in the run.

It only proposes: the loop verifies every token, so output equals plain decoding whatever the
pool holds. A pool is read, never written here; the server merges finished requests into the
pool of their API key (unless a request opts out). Without a pool (``tsspec generate``) it
drafts from the request's own tokens only.

Settings in ``SpeculationOptions.extra["ngram-pool"]``: ``pool`` (a ``DraftPool`` or None),
``min_share`` (how much of an entry's count its token must hold, default 0.5) and ``report`` (a
dict the speculator keeps counts in: drafts and tokens by source, and ``pool_matched``: pool
draft tokens the emitted text then equalled, verified or not).
"""

from __future__ import annotations

from typing import Any, Sequence

from tsspec import MAX_DRAFT_WINDOW, Proposal
from tsspec.protocols import DraftContext

from .memory import DraftPool

NAME = "ngram-pool"
OWN_ORDERS = (8, 7, 6, 5, 4, 3, 2)  # suffix lengths looked up in the sequence's own tokens
SETTING_KEYS = ("pool", "min_share", "report")
DEFAULT_MIN_SHARE = 0.5
DESCRIPTION = ("n-gram drafting from the request's own tokens and a pool of earlier requests' (one pool per "
               "API key, persisted across restarts by `tsspec serve`); no weights, serves every model")


class PoolSpeculator:
    """See the module docstring. Implements ``tsspec.protocols.Speculator`` structurally."""

    name = NAME
    can_arm_after_prefix_reuse = True  # it reads ``ctx.history``, which is always whole

    def __init__(self, pool: DraftPool | None = None, *, min_share: float = DEFAULT_MIN_SHARE,
                 report: dict | None = None, window: int = MAX_DRAFT_WINDOW):
        if not 0.0 < min_share <= 1.0:
            raise ValueError(f"min_share must be in (0, 1], got {min_share}")
        self.pool = pool
        self.min_share = float(min_share)
        self.max_draft_tokens = int(window)
        self.report = report if report is not None else {}
        for key in ("own_drafts", "own_tokens", "pool_drafts", "pool_tokens", "pool_matched"):
            self.report.setdefault(key, 0)
        self.reset()

    def reset(self) -> None:
        self._tokens: list[int] = []
        self._after: dict[int, int] = {}  # hash of an n-gram -> the position after its newest occurrence
        self._pending: tuple[int, list[int]] | None = None  # a pool draft: (its start, its tokens)

    def close(self) -> None:
        self.reset()

    # -- the request's own tokens --------------------------------------------------------
    def _append(self, token: int) -> None:
        tokens = self._tokens
        c = len(tokens)
        for n in OWN_ORDERS:
            if c >= n:
                self._after[hash(tuple(tokens[c - n:c]))] = c
        tokens.append(token)

    def _sync(self, history: Sequence[int]) -> None:
        tokens, size = self._tokens, len(history)
        if size < len(tokens) or (tokens and history[len(tokens) - 1] != tokens[-1]):
            self.reset()  # a new sequence on the same speculator
            tokens = self._tokens
        if self._pending is not None:
            start, draft = self._pending
            if size > start:
                matched = 0
                for a, b in zip(draft, history[start:start + len(draft)]):
                    if a != b:
                        break
                    matched += 1
                self.report["pool_matched"] += matched
                self._pending = None
        for token in history[len(tokens):]:
            self._append(int(token))

    def _own_match(self) -> tuple[int, int] | None:
        """(position after the match, order) of the longest earlier occurrence of the suffix."""
        tokens = self._tokens
        size = len(tokens)
        for n in OWN_ORDERS:
            if n >= size:
                continue
            tail = tokens[size - n:]
            at = self._after.get(hash(tuple(tail)))
            if at is not None and at < size and tokens[at - n:at] == tail:
                return at, n
        return None

    # -- the loop's calls ------------------------------------------------------------------
    def propose(self, ctx: DraftContext) -> list[int]:
        count = min(self.max_draft_tokens, ctx.max_tokens)
        history = ctx.history
        if count <= 0 or not len(history) or history[-1] != ctx.last_token:
            return []
        self._sync(history)
        own = self._own_match()
        pooled = self.pool.follower(self._tokens, self.min_share) if self.pool is not None else None
        if own is not None and (pooled is None or own[1] >= pooled[1]):
            at, order = own
            draft = self._tokens[at:at + count]
            self.report["own_drafts"] += 1
            self.report["own_tokens"] += len(draft)
            return draft
        if pooled is None:
            return []
        token, _, share = pooled
        draft, confidence = [token], [share]
        context = self._tokens[-OWN_ORDERS[0]:] + draft
        while len(draft) < count:
            found = self.pool.follower(context, self.min_share)
            if found is None:
                break
            draft.append(found[0])
            confidence.append(found[2])
            context = context[1:] + [found[0]]
        self.report["pool_drafts"] += 1
        self.report["pool_tokens"] += len(draft)
        self._pending = (len(self._tokens), draft)
        return Proposal(draft, confidence=confidence)

    def commit(self, tokens: Sequence[int], hidden_rows: Any, start_pos: int) -> None:
        """Nothing to do: ``propose`` reads what landed from ``ctx.history``."""


def make_pool_speculator(target: Any, options: Any) -> PoolSpeculator:
    """Registry factory: the settings of ``options.extra["ngram-pool"]`` (see the module)."""
    extra = getattr(options, "extra", None) or {}
    settings = dict(extra.get(NAME) or {})
    unknown = sorted(set(settings) - set(SETTING_KEYS))
    if unknown:
        raise ValueError(f"unknown {NAME} settings {unknown}; known: {list(SETTING_KEYS)}")
    pool = settings.get("pool")
    if pool is not None and not isinstance(pool, DraftPool):
        raise ValueError(f"{NAME}: 'pool' must be a DraftPool, got {type(pool).__name__}")
    return PoolSpeculator(pool, min_share=float(settings.get("min_share", DEFAULT_MIN_SHARE)),
                          report=settings.get("report"))
