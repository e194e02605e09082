"""N-gram (prompt lookup) matching: where did the current suffix occur before, and what followed?

Pure Python, no torch: the index and the drafter work on plain lists of token ids, so they are
tested on tiny integer arrays and timed without a model.

Index. One dict per n-gram order ``n`` (``min_order .. max_order``, 2..8 by default) maps
``hash(tokens[c-n:c])`` to the positions ``c`` right AFTER the most recent occurrences of that
n-gram. An entry for the n-gram ending at position ``c-1`` is inserted only when token ``c``
arrives, so:

* the current suffix is never in its own index (a lookup can never match it against itself),
* every stored position has at least one known continuation token (``c < len(tokens)``).

Appending a token costs one dict update per order; a lookup costs one dict read per order,
longest order first. Both are O(1) in the length of the history. The key is a 64-bit chain of
tuple hashes (``NGramIndex.key``); whatever it says, every hit is re-checked token by token,
so a collision (the tests force them with a tiny modulus) can only cost a missed or rejected
draft, never a wrong match. Rewinds are exact: each append logs the values it overwrote, and ``truncate``
replays that log backwards.

Draft. From a match at ``c`` the draft copies what followed: ``tokens[c], tokens[c+1], ..``,
up to the window, cut at the end of the known history.

Worked example (orders 2..3; positions under the tokens)::

    tokens   5  1  2  3  9  1  2
    pos      0  1  2  3  4  5  6          len = 7, suffix ends at 6

    order 3: (9, 1, 2) never occurred before             -> no hit
    order 2: (1, 2) occurred at 1..2, so c = 3             -> re-check tokens[1:3] == [1, 2]: ok
    draft (window 6):            tokens[3:7]             =  [3, 9, 1, 2]   (cut at the end)

Beyond the plain form (each measured, see the package README and ``scripts/acceptance.py``):

* ``follow``: keep copying from the place the last draft came from while it keeps agreeing
  (the copy source a rewrite is walking through), instead of jumping to the most recent
  occurrence of a short suffix, which is often somewhere else.
* ``fallback``: when the last ``min_order`` tokens never occurred before, the last token alone
  drafts, if every earlier occurrence of it had the same follower (``NGramIndex.mixed``, kept
  for order 1) and a draft's copy agreed with the text at most ``FALLBACK_RECENT`` tokens ago:
  a copied span that broke on one reworded token (``NGramDrafter._fallback_match``).

The speculator turns on ``follow`` and ``fallback`` and leaves the draft's length to the loop.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

DEFAULT_MIN_ORDER = 2
DEFAULT_MAX_ORDER = 8
EXTENDED_MATCH = 32  # how far back the follow source is compared
# fallback: a single-token match may draft only this many tokens after a draft's copy last
# agreed with the text (inside a copied span that broke on a reworded token)
FALLBACK_RECENT = 3
PMIN_ORDER_SCALE = 8  # --spec-pmin p asks for a match of ceil(p * 8) tokens (clamped to the orders)

__all__ = [
    "DEFAULT_MIN_ORDER",
    "DEFAULT_MAX_ORDER",
    "NGramIndex",
    "NGramDrafter",
    "Match",
    "required_match_length",
]


def required_match_length(
    pmin: float, min_order: int = DEFAULT_MIN_ORDER, max_order: int = DEFAULT_MAX_ORDER
) -> int:
    """The shortest suffix match that may draft, from ``--spec-pmin``.

    ``pmin <= 0`` -> ``min_order`` (any indexed match); otherwise ``clamp(ceil(pmin * 8),
    min_order, max_order)``: 0.25 -> 2, 0.5 -> 4, 0.75 -> 6, 1.0 -> 8. A longer required match
    drafts less often and is right more often: the same knob as a confidence gate.
    """
    if not pmin or pmin <= 0.0:
        return min_order
    return max(min_order, min(max_order, math.ceil(pmin * PMIN_ORDER_SCALE)))


class Match(NamedTuple):
    """A re-checked hit: ``pos`` is where the continuation starts, ``length`` how many tokens
    before it are known to equal the current suffix (at least the order that found it)."""

    pos: int
    length: int


class NGramIndex:
    """Tokens plus one hash map per order; see the module docstring for the layout."""

    def __init__(
        self,
        min_order: int = DEFAULT_MIN_ORDER,
        max_order: int = DEFAULT_MAX_ORDER,
        *,
        modulus: int | None = None,
    ) -> None:
        if not 1 <= min_order <= max_order:
            raise ValueError(f"orders must satisfy 1 <= min_order <= max_order, got {min_order}..{max_order}")
        if modulus is not None and modulus < 1:
            raise ValueError("modulus must be positive")
        self.min_order = min_order
        self.max_order = max_order
        self.modulus = modulus
        self.tokens: list[int] = []
        # maps[n - min_order]: key of an n-gram -> the continuation position after its newest occurrence
        self.maps: list[dict[int, int]] = [{} for _ in range(min_order, max_order + 1)]
        # keys of the n-grams ending at the last token, by order (only orders that fit)
        self._tail_keys: list[int] = []
        # per appended token: the values its inserts replaced (None: the key was new), by order
        self._undo: list[list[int | None]] = []
        # order 1 only (min_order 1): token -> how many of its occurrences were followed by
        # another token than the occurrence before them; absent: every earlier occurrence of
        # the token was followed by the same token (the fallback rule's evidence)
        self.mixed: dict[int, int] = {}
        self._mixed_undo: list[int | None] = []  # per appended token: the context it marked mixed

    def __len__(self) -> int:
        return len(self.tokens)

    # -- hashing --------------------------------------------------------------------------
    def key(self, gram: Sequence[int]) -> int:
        """The key of one n-gram (oldest token first); the same value the index stores.

        A chain of tuple hashes from the newest token back: ``h1 = t[-1]``,
        ``h(n) = hash((h(n-1), t[-n]))``, so all orders ending at one position cost one small
        hash each; ``modulus`` (tests only) folds keys together to force collisions.
        """
        h = gram[-1]
        for tok in reversed(gram[:-1]):
            h = hash((h, tok))
        return h if self.modulus is None else h % self.modulus

    def _keys_ending_at(self, end: int) -> list[int]:
        """Keys of the n-grams ending at ``end`` for orders min_order.. (as many as fit)."""
        toks = self.tokens
        h = toks[end]
        keys = [h] if self.min_order == 1 else []
        for k in range(1, min(self.max_order, end + 1)):  # k + 1 = order
            h = hash((h, toks[end - k]))
            if k + 1 >= self.min_order:
                keys.append(h)
        if self.modulus is not None:
            keys = [key % self.modulus for key in keys]
        return keys

    # -- mutation -------------------------------------------------------------------------
    def append(self, token: int) -> None:
        """Add one token: the n-grams ending just before it now have a continuation."""
        c = len(self.tokens)
        self.tokens.append(token)
        prevs: list[int | None] = []
        for table, key in zip(self.maps, self._tail_keys):
            prevs.append(table.get(key))
            table[key] = c
        if self.min_order == 1 and c:
            self._note_continuation(c, prevs[0] if prevs else None)
        self._undo.append(prevs)
        if len(self._mixed_undo) < len(self._undo):
            self._mixed_undo.append(None)
        self._tail_keys = self._keys_ending_at(c)

    def _note_continuation(self, c: int, prev: int | None) -> None:
        """Order 1: token ``c`` follows ``tokens[c-1]``, whose previous occurrence was followed
        by ``tokens[prev]`` (``prev`` None: none). A different follower, or a key that only
        collided (``modulus``), marks the context mixed."""
        toks = self.tokens
        context = toks[c - 1]
        if prev is None or (toks[prev - 1] == context and toks[prev] == toks[c]):
            self._mixed_undo.append(None)
            return
        self.mixed[context] = self.mixed.get(context, 0) + 1
        self._mixed_undo.append(context)

    def agreed(self, token: int) -> bool:
        """Order 1 (min_order 1): was every earlier occurrence of ``token`` followed by the same
        token? (True for a token seen once before.)"""
        return token not in self.mixed

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.append(token)

    def truncate(self, length: int) -> None:
        """Forget every token at position >= ``length`` and every entry they created."""
        length = max(0, length)
        if length >= len(self.tokens):
            return
        maps, undo_log, toks = self.maps, self._undo, self.tokens
        while len(toks) > length:
            c = len(toks) - 1
            keys = self._keys_ending_at(c - 1) if c else []  # what appending toks[c] inserted
            for table, key, prev in zip(maps, keys, undo_log.pop()):
                if prev is None:
                    del table[key]
                else:
                    table[key] = prev
            context = self._mixed_undo.pop()
            if context is not None:
                left = self.mixed[context] - 1
                if left:
                    self.mixed[context] = left
                else:
                    del self.mixed[context]
            toks.pop()
        self._tail_keys = self._keys_ending_at(length - 1) if length else []

    def clear(self) -> None:
        self.tokens = []
        self.maps = [{} for _ in self.maps]
        self._tail_keys = []
        self._undo = []
        self.mixed = {}
        self._mixed_undo = []

    def write(self, tokens: Sequence[int], start: int) -> bool:
        """Make ``tokens`` the sequence from ``start`` on and end the sequence after them.

        Tokens already present and equal are kept (no re-indexing); the first difference
        truncates. Returns False, changing nothing, when ``start`` lies past the end (a gap
        this index cannot fill: the caller resyncs from the full history later).
        """
        own = self.tokens
        if start > len(own):
            return False
        n = len(tokens)
        k = 0
        limit = min(n, len(own) - start)
        while k < limit and own[start + k] == tokens[k]:
            k += 1
        self.truncate(start + k)  # also drops stale tokens past start + n
        for j in range(k, n):
            self.append(tokens[j])
        return True

    # -- lookup ---------------------------------------------------------------------------
    def lookup(self, min_length: int | None = None) -> Match | None:
        """The best re-checked earlier occurrence of the current suffix, or None: longest order
        first, the most recent occurrence within an order. ``min_length`` (default
        ``min_order``) is the shortest order tried.
        """
        toks = self.tokens
        end = len(toks)
        low = self.min_order if min_length is None else max(self.min_order, min_length)
        keys, maps = self._tail_keys, self.maps
        if low > end - 1 or keys[low - self.min_order] not in maps[low - self.min_order]:
            # no earlier occurrence of the shortest suffix means none of a longer one either
            # (it would end at the same place): one probe decides a miss, the common case
            return None
        for order in range(min(self.max_order, end - 1), low - 1, -1):
            slot = order - self.min_order
            found = maps[slot].get(keys[slot])
            if found is None:
                continue
            if toks[found - order : found] == toks[end - order:]:
                return Match(found, order)
            # else a hash collision: never trusted
        return None


def match_length(tokens: Sequence[int], a: int, b: int, cap: int) -> int:
    """How many tokens before position ``a`` equal those before ``b`` (at most ``cap``)."""
    n = 0
    limit = min(cap, a, b)
    while n < limit and tokens[a - 1 - n] == tokens[b - 1 - n]:
        n += 1
    return n


def continuation(tokens: Sequence[int], pos: int, count: int) -> list[int]:
    """Up to ``count`` tokens copied from ``pos`` on, cut at the end of ``tokens``."""
    return list(tokens[pos : min(len(tokens), pos + count)])


class NGramDrafter:
    """An ``NGramIndex`` kept in step with a token history, plus the drafting policy.

    ``propose(history, k, min_length)`` brings the index up to date in O(new tokens) (O(history)
    only when the history was rewritten behind its back) and proposes up to ``k`` tokens.
    """

    def __init__(
        self,
        min_order: int = DEFAULT_MIN_ORDER,
        max_order: int = DEFAULT_MAX_ORDER,
        *,
        follow: bool = False,
        modulus: int | None = None,
        fallback: bool = False,
    ) -> None:
        # fallback: the index also keeps order 1, consulted only when no longer match exists
        self.min_order = min_order
        self.fallback = bool(fallback) and min_order > 1
        lowest = 1 if self.fallback else min_order
        self.index = NGramIndex(lowest, max_order, modulus=modulus)
        self.follow = follow
        self._clear_policy_state()

    def _clear_policy_state(self) -> None:
        # where the last draft was copied from, and the history length when it was made
        self._source: int | None = None
        self._source_end = 0
        self._match = Match(0, 0)  # the match behind the last draft
        self._draft: list[int] = []  # the last draft, while its fate is unknown
        self._agreed_end = -FALLBACK_RECENT - 1  # history length where a draft last agreed

    def reset(self) -> None:
        self.index.clear()
        self._clear_policy_state()

    def write(self, tokens: Sequence[int], start: int) -> bool:
        """Committed tokens at ``start`` (see ``NGramIndex.write``)."""
        return self.index.write(tokens, start)

    def sync(self, history: Sequence[int]) -> None:
        """Bring the index up to ``history`` (the authority) in O(new tokens).

        The protocol's case, the index holding a prefix of ``history``, is recognised by spot
        checks (the index's last token and position 0). A disagreement seen there (another
        sequence, a rewrite nobody committed) truncates at the first differing token. A
        difference elsewhere goes unseen here; ``propose`` catches it when a draft would use it.
        """
        own = self.index.tokens
        if len(own) > len(history):
            self.index.truncate(len(history))
        have = len(own)
        if have and (own[have - 1] != history[have - 1] or own[0] != history[0]):
            self.resync(history)
        else:
            self._extend_from(history, have)

    def resync(self, history: Sequence[int]) -> None:
        """Exact, O(history): truncate at the first token that differs, then append the rest."""
        own = self.index.tokens
        limit = min(len(own), len(history))
        first = 0
        while first < limit and own[first] == history[first]:
            first += 1
        self.index.truncate(first)
        self._extend_from(history, first)

    def _extend_from(self, history: Sequence[int], start: int) -> None:
        append = self.index.append
        for pos in range(start, len(history)):
            append(history[pos])

    def propose(self, history: Sequence[int], count: int, min_length: int | None = None) -> list[int]:
        """``sync`` then ``draft``, re-checking against ``history`` every token the draft rests
        on (the matched occurrence, its continuation and the suffix; O(window + match)), with an
        exact ``resync`` and a second try when they differ: a draft always copies a genuine
        earlier occurrence in ``history``."""
        self.sync(history)
        draft = self.draft(count, min_length)
        if draft and not self._rests_on(history, len(draft)):
            self.resync(history)
            draft = self.draft(count, min_length)
        return draft

    def _rests_on(self, history: Sequence[int], count: int) -> bool:
        """Do the matched tokens, the copied continuation and the suffix equal ``history``?"""
        own = self.index.tokens
        end = len(own)
        pos, length = self._match
        length = min(length, self.index.max_order)  # enough to make the match genuine
        for lo, hi in ((pos - length, min(end, pos + count)), (end - length, end)):
            for j in range(lo, hi):
                if own[j] != history[j]:
                    return False
        return True

    def _follow_match(self, min_length: int) -> Match | None:
        """The last draft's source advanced by what landed since, if it still agrees."""
        if self._source is None:
            return None
        toks = self.index.tokens
        end = len(toks)
        pos = self._source + (end - self._source_end)
        if not 0 < pos < end:
            return None
        length = match_length(toks, pos, end, EXTENDED_MATCH)
        return Match(pos, length) if length >= min_length else None

    def find(self, min_length: int | None = None) -> Match | None:
        """The match a draft would copy from (see ``NGramIndex.lookup`` and ``follow``)."""
        index = self.index
        low = self.min_order if min_length is None else max(self.min_order, min_length)
        found = index.lookup(low)
        if self.follow:
            followed = self._follow_match(low)
            if followed is not None:
                if found is None:
                    return followed
                end = len(index.tokens)
                length = match_length(index.tokens, found.pos, end, EXTENDED_MATCH)
                if followed.length >= length:  # a tie goes to the source that agreed last
                    return followed
        if found is None and self.fallback and low == self.min_order:
            found = self._fallback_match()
        return found

    def _fallback_match(self) -> Match | None:
        """No earlier occurrence of the last ``min_order`` tokens: the most recent earlier
        occurrence of the last token alone, when every earlier occurrence of it was followed by
        the same token and a draft's source agreed with the text at most ``FALLBACK_RECENT``
        tokens ago (a copied span that broke on a reworded token). Both conditions select the
        single-token matches that land about as often as a shared bigram on grounded prompts
        (README)."""
        index = self.index
        toks = index.tokens
        end = len(toks)
        if end - self._agreed_end > FALLBACK_RECENT or not index.agreed(toks[-1]):
            return None
        return index.lookup(1)

    def _learn(self) -> None:
        """Note where the previous draft stopped agreeing with the text, now that the tokens
        after it are known (the ``fallback`` rule's evidence)."""
        draft, self._draft = self._draft, []
        toks, start = self.index.tokens, self._source_end
        if draft and start < len(toks) <= start + len(draft) + 1 and toks[start] == draft[0]:
            agreed = 1
            while agreed < len(draft) and start + agreed < len(toks) and toks[start + agreed] == draft[agreed]:
                agreed += 1
            self._agreed_end = start + agreed  # where the copy stopped agreeing with the text

    def draft(self, count: int, min_length: int | None = None) -> list[int]:
        """Up to ``count`` tokens that followed the best earlier match of the current suffix."""
        self._learn()
        toks = self.index.tokens
        if count <= 0:
            return []
        found = self.find(min_length)
        if found is None:
            self._source = None
            return []
        self._source, self._source_end = found.pos, len(toks)
        self._match = found
        draft = continuation(toks, found.pos, count)
        self._draft = draft
        return draft
