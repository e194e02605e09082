"""NGramSpeculator: weight-free drafting from the sequence's own history (prompt lookup).

It drafts by finding where the last few tokens occurred earlier in the prompt or the output and
proposing what followed (``matching.py`` holds the logic). No weights and no hidden state, so it
serves every target whose trunk verifies on its own, and it survives a KV prefix it never saw
(``can_arm_after_prefix_reuse``): its input is the emitted token stream, which ``DraftContext``
always carries in full.

``--spec-pmin`` scales the required match length instead of gating a probability:
``pmin <= 0`` -> the shortest order (2); otherwise ``clamp(ceil(pmin * 8), 2, 8)`` tokens of
the suffix must match (0.25 -> 2, 0.5 -> 4, 0.75 -> 6, 1.0 -> 8).

State and the loop's calls:

* ``commit(tokens, _, start_pos)`` writes the committed tokens into the index at ``start_pos``
  (an earlier position rewinds it exactly; a later one is a gap, filled at the next propose).
* ``propose(ctx)`` first syncs the index with ``ctx.history`` (the authority; ends with
  ``ctx.last_token``, which is not committed yet), usually by appending that one token, then
  looks the suffix up: O(1) in the history length.

Draft length: the speculator proposes the whole continuation (up to ``max_tokens``); the loop's
governor decides whether drafting pays on this run and parks it while it does not.

Policy (``follow`` and ``fallback`` on) is explained in ``matching.py``; a ``fallback`` draft
(the last token alone, when no earlier bigram exists);
``SpeculationOptions.extra["ngram"]`` overrides any of ``SETTING_KEYS``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tsspec.protocols import DraftContext
from tsspec import MAX_DRAFT_WINDOW

from .matching import DEFAULT_MAX_ORDER, DEFAULT_MIN_ORDER, NGramDrafter, required_match_length

NAME = "ngram"
DEFAULT_MIN_DRAFT_PROB = 0.0
DEFAULT_WINDOW = 8  # used only when no options object is given
# follow, from scripts/acceptance.py on the embedded model's greedy outputs (README): it raised
# input-grounded acceptance 0.585 -> 0.604 at equal cost
DEFAULT_FOLLOW = True
# fallback: when no earlier occurrence of the last two tokens exists, draft from the last token
# alone if every earlier occurrence of it was followed by the same token and a copy agreed with
# the text at most 3 tokens ago (matching.FALLBACK_RECENT)
DEFAULT_FALLBACK = True
# keys accepted in SpeculationOptions.extra["ngram"]
SETTING_KEYS = ("min_order", "max_order", "follow", "fallback")


class NGramSpeculator:
    """The ``ngram`` algorithm. Implements ``tsspec.protocols.Speculator`` structurally."""

    name = NAME
    default_min_draft_prob = DEFAULT_MIN_DRAFT_PROB
    needs_hidden_state = False
    handles_own_prefill = False
    can_arm_after_prefix_reuse = True

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        min_draft_prob: float = DEFAULT_MIN_DRAFT_PROB,
        *,
        min_order: int = DEFAULT_MIN_ORDER,
        max_order: int = DEFAULT_MAX_ORDER,
        follow: bool = DEFAULT_FOLLOW,
        modulus: int | None = None,
        fallback: bool = DEFAULT_FALLBACK,
    ) -> None:
        if window < 1:
            raise ValueError(f"draft window must be at least 1, got {window}")
        self.max_draft_tokens = int(window)
        self._orders = (min_order, max_order)
        self.min_draft_prob = float(min_draft_prob)  # sets required_match
        self._drafter = NGramDrafter(
            min_order,
            max_order,
            follow=follow,
            modulus=modulus,
            fallback=fallback,
        )
        self.history_mismatches = 0  # proposals skipped because history did not end in last_token

    @property
    def min_draft_prob(self) -> float:
        """MinDraftProb: here it scales the suffix length a match needs (``required_match``)."""
        return self._min_draft_prob

    @min_draft_prob.setter
    def min_draft_prob(self, value: float) -> None:
        self._min_draft_prob = float(value)
        self.required_match = required_match_length(self._min_draft_prob, *self._orders)

    @property
    def indexed_tokens(self) -> int:
        """How many tokens the index holds (for tests and diagnostics)."""
        return len(self._drafter.index)

    def propose(self, ctx: DraftContext) -> list[int]:
        count = min(self.max_draft_tokens, ctx.max_tokens)  # the loop capped max_tokens already
        if count <= 0:
            return []
        history = ctx.history
        if not len(history) or history[-1] != ctx.last_token:
            self.history_mismatches += 1
            return []
        return self._drafter.propose(history, count, self.required_match)

    def commit(self, tokens: Sequence[int], hidden_rows: Any, start_pos: int) -> None:
        """Record what landed; ``hidden_rows`` is unused (``needs_hidden_state`` is False)."""
        self._drafter.write([int(t) for t in tokens], int(start_pos))

    def reset(self) -> None:
        self._drafter.reset()

    def close(self) -> None:
        self._drafter.reset()


def _settings(options: Any) -> Mapping[str, Any]:
    extra = getattr(options, "extra", None) or {}
    settings = extra.get(NAME) or {}
    unknown = sorted(set(settings) - set(SETTING_KEYS))
    if unknown:
        raise ValueError(f"unknown ngram settings {unknown}; known: {list(SETTING_KEYS)}")
    return settings


def make_ngram(target: Any, options: Any) -> NGramSpeculator:
    """Registry factory: ``--spec-pmin`` (default 0) as the match-length requirement (the loop
    decides the window and caps every ``DraftContext.max_tokens``), policy overrides from
    ``options.extra["ngram"]``. Serves every target (the registry already declined those whose
    trunk is unprofitable without its own drafter)."""
    if options is None:
        from tsspec import SpeculationOptions

        options = SpeculationOptions()
    settings = dict(_settings(options))
    pmin = DEFAULT_MIN_DRAFT_PROB if options.pmin is None else options.pmin  # the registry sets it too
    return NGramSpeculator(MAX_DRAFT_WINDOW, pmin, **settings)
