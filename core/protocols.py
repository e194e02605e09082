"""The public contracts between the shared loop, model adapters, algorithms and drafter weights.

Three layers that must never be conflated (see docs/architecture.md):

* ``SpeculativeTarget`` -- a model adapter: a multi-row forward with per-row logits plus rollback.
* ``Speculator`` -- an algorithm: how drafts are proposed. Written once, works on many models.
* ``DraftHead`` -- trained drafter weights bound to one target, attached to it by composition.

Everything here is structural (``typing.Protocol``): plugins implement the members, they do not
inherit from tsspec classes. Tensors are ``torch.Tensor``; shapes are given in comments.
"""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING, Any, Callable, Hashable, Protocol, Sequence, runtime_checkable

import attrs

if TYPE_CHECKING:  # torch is only needed for annotations here: importing protocols stays cheap
    import torch

__all__ = [
    "ModelConfig",
    "Tokenizer",
    "SpeculativeTarget",
    "BatchedSpeculativeTarget",
    "PagedKV",
    "PagedRows",
    "SpecTrunk",
    "Speculator",
    "DraftHead",
    "DraftHeadKind",
    "DraftContext",
    "HeadCounts",
    "PrecedingTokens",
    "Proposal",
    "SpeculatorDeclined",
    "require_feature_width",
    "resolve_feature_taps",
]


class SpeculatorDeclined(Exception):
    """Raised by a speculator factory that cannot serve a target; the message is the reason.

    The registry turns it into a ``cannot_serve`` decline that ``tsspec list-speculators`` prints,
    so the message should say what is missing ("no Medusa file attached (--spec-draft-model)").
    """


def require_feature_width(target: Any, width: int, reader: str, hint: str = "") -> None:
    """Decline (``SpeculatorDeclined``) unless the target's hidden rows are ``width`` wide: the
    one check a factory whose drafter reads hidden rows makes (feature taps change the width).

    ``reader`` names what reads them ("the block drafter"); ``hint`` says what to do about it.
    """
    have = int(target.spec_feature_size)
    if have != int(width):
        raise SpeculatorDeclined(
            f"the model's hidden rows are {have} wide but {reader} reads {int(width)}"
            + (f" ({hint})" if hint else "")
        )


def resolve_feature_taps(layers: Sequence[int] | None, num_layers: int) -> tuple[int, ...] | None:
    """What ``spec_set_feature_taps(layers)`` stores: None (or no layers) restores the default
    hidden rows; otherwise the layer ids as a tuple, each a residual index in ``0..num_layers``
    (ValueError naming the range otherwise).

    >>> resolve_feature_taps([2, 0], 4), resolve_feature_taps(None, 4), resolve_feature_taps([], 4)
    ((2, 0), None, None)
    """
    if not layers:
        return None
    taps = tuple(int(layer) for layer in layers)
    if any(not 0 <= t <= int(num_layers) for t in taps):
        raise ValueError(f"feature taps must be layer ids in 0..{int(num_layers)}, got {list(taps)}")
    return taps


class DraftHeadKind(enum.Enum):
    """What kind of trained drafter a target carries; decides what ``--spec-type auto`` picks."""

    NONE = "none"
    PER_TOKEN = "per_token"  # MTP / NextN / EAGLE-shaped: one token per call, chained
    BLOCK = "block"  # DFlash / DFlash2 / DSpark: a whole block per call


@attrs.frozen
class ModelConfig:
    """The facts about a target that algorithms may read (never its name to branch on)."""

    architecture: str  # GGUF general.architecture, for display and records only
    vocab_size: int
    hidden_size: int
    num_layers: int
    context_length: int
    extra: dict[str, Any] = attrs.field(factory=dict)  # model-specific facts for drafters


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> ids. A target loaded without one still works on token ids."""

    bos_token_id: int | None
    eos_token_ids: frozenset[int]  # every id that ends generation (eos, eot, im_end...)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> str: ...


class PrecedingTokens(Sequence[int]):
    """``history`` followed by ``drafts``, without copying the history (a copy would make every
    proposal O(context)); what ``DraftContext.adjust_logits`` reads for the next draft.

    >>> list(PrecedingTokens([1, 2, 3], [7]))
    [1, 2, 3, 7]
    >>> PrecedingTokens([1, 2, 3], [7, 8])[-3:]
    [3, 7, 8]
    """

    __slots__ = ("_history", "_drafts")

    def __init__(self, history: Sequence[int], drafts: Sequence[int] = ()):
        self._history = history
        self._drafts = list(drafts)

    def __len__(self) -> int:
        return len(self._history) + len(self._drafts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n, size = len(self._history), len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("preceding-token index out of range")
        return self._history[index] if index < n else self._drafts[index - n]

    def __iter__(self):
        yield from self._history
        yield from self._drafts

    def __repr__(self) -> str:
        return f"PrecedingTokens(history={len(self._history)}, drafts={self._drafts})"


class Proposal(list):
    """A draft (a list of token ids) with its ``confidence``: one float in [0, 1] per draft
    token, the drafter's own estimate that the token is right (a learned head's top-1
    probability). The loop measures how often tokens of each confidence land in this run
    (``runtime.calibration``) and verifies the prefix with the most expected tokens per
    measured millisecond, possibly none (the step is then a plain one). A plain list is
    verified whole (up to ``DraftContext.max_tokens``).

    >>> Proposal([5, 6], confidence=[0.9, 0.4]).confidence
    [0.9, 0.4]
    """

    __slots__ = ("confidence",)

    def __init__(self, tokens: Sequence[int] = (), confidence: Sequence[float] | None = None):
        super().__init__(tokens)
        self.confidence = None if confidence is None else list(confidence)


@attrs.frozen
class DraftContext:
    """Everything a speculator may look at when proposing. One object, not a parameter list,
    so a future signal becomes a new field instead of a new overload in every plugin.

    ``last_token`` sits at absolute ``position`` and is NOT yet in the trunk's cache; a draft
    ``[d1..dk]`` guesses the tokens at positions ``position+1 ..``. ``history`` is the whole
    sequence so far (prompt and emitted tokens) and ends with ``last_token``.

    ``window`` is the draft window the loop decided once for the sequence (the operator's
    ``--spec-draft``, else the default narrowed by the target's preferred window and the
    speculator's ``max_draft_tokens``); ``max_tokens`` is this step's cap (the window further
    cut by the token budget, the context and the governor). Never propose more than
    ``max_tokens``: the loop has already capped it, there is nothing left to re-cap.
    """

    last_token: int
    position: int
    max_tokens: int  # already capped by the window, the token budget, the context, the governor
    history: Sequence[int]  # read-only view; history[-1] == last_token
    carry_hidden: "torch.Tensor | None" = None  # [spec_feature_size]: the row that predicted last_token
    # Applies the sampler's logit adjustments (repetition penalty...) for a draft whose
    # preceding tokens are ``tokens``: adjust_logits(logits [vocab], tokens) -> logits [vocab].
    # Pass ``preceding(drafts_so_far)`` as ``tokens``.
    adjust_logits: Callable[["torch.Tensor", Sequence[int]], "torch.Tensor"] | None = None
    vocab_size: int = 0
    # how many preceding tokens adjust_logits reads; 0: it reads none and changes nothing (no
    # adjustment is on), so a drafter may skip calling it. An adjustment that reads no tokens but
    # changes logits (a bias) must report a lookback of at least 1.
    adjust_lookback: int = 0
    window: int = 0  # the sequence's draft window (0 when the context was built by hand: use max_tokens)

    def preceding(self, drafts: Sequence[int] = ()) -> Sequence[int]:
        """The tokens before the next draft: ``history`` then ``drafts`` (no copy of history)."""
        return PrecedingTokens(self.history, drafts)


@runtime_checkable
class DraftHead(Protocol):
    """Trained drafter weights bound to one target: a thin adapter, like a LoRA file.

    Per-token heads implement ``draft_step`` and ``draft_catch_up`` (optionally the fused
    ``draft_catch_up_and_step``); block heads implement ``draft_block``. A head with sequence
    state may offer ``for_sequence()``: a view sharing its weights with its own sequence state
    (optionally ``close()`` to free it), one per speculator (docs/plugins.md, ``DraftHead``).
    """

    kind: DraftHeadKind
    block_size: int  # tokens per block for BLOCK heads (anchor included); 1 for PER_TOKEN
    resumes_after_gap: bool  # may the head draft after a KV prefix it never saw? (default False)

    def draft_step(
        self, token: int, h_prev: "torch.Tensor", pos: int
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Feed ``token`` at ``pos`` with ``h_prev`` [H] (the row that predicted it); return
        (logits [vocab] for position pos+1, the head's hidden output [H] to chain)."""
        ...

    def draft_block(
        self, last_token: int, h_prev: "torch.Tensor", position: int, max_tokens: int
    ) -> tuple[list[int], list[float]]:
        """Propose up to ``max_tokens`` tokens after ``last_token`` (at ``position``) in one pass;
        returns (tokens, per-token confidences in [0, 1])."""
        ...

    def draft_catch_up(
        self, tokens: Sequence[int], h_rows: "torch.Tensor", start_pos: int
    ) -> None:
        """Tell the head what landed: tokens at start_pos.., h_rows [n, H] the rows that predicted
        them (the commit contract). Drops any speculative state beyond start_pos."""
        ...

    def reset(self) -> None: ...


_COUNTS_LOCK = threading.Lock()  # every HeadCounts update: a few integer adds under one lock


class HeadCounts:
    """The calls and rows a draft head ran, for one head or one sequence view of it.

    A view's counts also add to its head's, so the head's figures are the totals over every
    sequence. Views run in threads of their own, and the head itself may run in another, so
    every update (a view's and the head's alike) takes one lock. Not a base class: a head holds
    one as ``counts``, and a view made by ``for_sequence`` holds ``counts.view()``::

        head.counts = HeadCounts()
        view.counts = head.counts.view()  # in for_sequence, on the copy
        view.counts.add(rows=3)           # once a forward: view 1 call / 3 rows, head the same
        head.counts.calls, head.counts.rows
    """

    __slots__ = ("calls", "rows", "root")

    def __init__(self, root: "HeadCounts | None" = None):
        self.calls = 0  # forwards run
        self.rows = 0  # rows forwarded (cost accounting)
        self.root = root  # the head's counts a view also adds to; None on the head itself

    def view(self) -> "HeadCounts":
        """Fresh counts for a sequence view that also add to the head's (a view of a view adds
        to the same head)."""
        return HeadCounts(self.root or self)

    def add(self, rows: int = 0) -> None:
        """One forward of ``rows`` rows."""
        with _COUNTS_LOCK:
            self.calls += 1
            self.rows += rows
            if self.root is not None:
                self.root.calls += 1
                self.root.rows += rows

    def __repr__(self) -> str:
        return f"HeadCounts(calls={self.calls}, rows={self.rows})"


@runtime_checkable
class SpeculativeTarget(Protocol):
    """What the shared loop needs from a model, and nothing about drafting.

    Call protocol (the loop guarantees it; adapters may rely on it):

    * ``spec_forward`` appends ``tokens`` at positions ``cache_seq_len ..`` and advances
      ``cache_seq_len`` by ``len(tokens)``. ``all_logits_rows=True`` marks a verify: only then
      may the loop keep fewer rows than it forwarded.
    * Every ``spec_forward`` is followed by ONE rollback call, ``spec_keep(rows_kept)``: keep
      the state after the first ``rows_kept`` rows of that forward (``1 <= rows_kept <= rows``;
      prefill and plain steps keep every row). A KV target sets its length to
      ``start + rows_kept``; a hybrid target commits a per-row recurrent slot, or restores the
      state it saved when the verify began and re-forwards the kept rows itself. It may return
      a word for the statistics ('committed', 'reforward'); None is counted as 'all' when
      every row is kept, else 'rewound' (KV targets) or 'committed'.
    * ``spec_rewind_cache(length)`` goes back to an earlier length between forwards: ``0``
      starts a fresh sequence (clears recurrent state too); other lengths are legal where the
      KV alone holds the state (``spec_verify_persists_accepted_kv``: reusing a cached prefix).

    The specification's snapshot / restore / rewind trio stays behind ``spec_keep``: a target
    that needs it saves its recurrent state when a verify begins and restores it there. The
    optional facts (``speculation_profitable`` ... ``spec_verify_row_ms``) are read through
    ``tsspec.capabilities.TargetInfo``, defaults there.
    """

    config: ModelConfig
    tokenizer: Tokenizer | None
    draft_head: DraftHead | None  # composition: the drafter is attached, not inherited

    @property
    def cache_seq_len(self) -> int: ...

    @property
    def max_context_length(self) -> int: ...

    @property
    def spec_feature_size(self) -> int:
        """Width of a hidden row: hidden_size, or taps x hidden_size when feature taps are set."""
        ...

    speculation_profitable: bool  # False when the trunk cannot verify without its own drafter
    speculation_refusal: str | None  # a reason the target refuses speculation outright
    spec_preferred_draft_window: int | None  # narrows the default window (e.g. 3 on hybrids)
    spec_verify_persists_accepted_kv: bool  # True: a rejected tail is undone by a KV rewind

    def spec_forward(
        self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool
    ) -> tuple["torch.Tensor", "torch.Tensor | None"]:
        """One batched forward. Returns logits [rows, vocab] (only [1, vocab], the last row,
        when all_logits_rows is False) and hidden [rows, spec_feature_size] or None."""
        ...

    def spec_ensure_capacity(self, required_seq_len: int) -> None: ...

    def spec_keep(self, rows_kept: int) -> "str | None":
        """Keep the state after the first ``rows_kept`` rows of the last forward (see above)."""
        ...

    def spec_rewind_cache(self, length: int) -> None: ...

    def spec_set_feature_taps(self, layers: Sequence[int] | None) -> None:
        """Make hidden rows the concatenated residuals ENTERING ``layers`` (DFlash-style
        drafters); None restores the default (the last post-norm hidden state)."""
        ...


@attrs.frozen
class PagedRows:
    """One sequence's part of a batched paged forward: its block table (the blocks holding its
    positions 0, 1, ... in order), ``past`` positions already in them, and the new ``tokens``
    (at positions past ..). ``all_logits``: logits for every row (a verify), else the last row.
    ``seq``: the sequence's id, stable from admission to release (a hybrid trunk keys its
    per-sequence recurrent state by it)."""

    blocks: Sequence[int]
    past: int
    tokens: Sequence[int]
    all_logits: bool = False
    want_hidden: bool = False
    seq: int = 0


@runtime_checkable
class PagedKV(Protocol):
    """A target's KV in ``num_blocks`` fixed-size blocks and one forward over a ragged batch.

    Block tables are the caller's (the batched driver's plain tables, the serve plugin's
    prefix cache); the plugin owns the tensors. On a batch-invariant path a
    sequence's rows are computed exactly as in a forward of that sequence alone.

    Optional, for trunks with per-sequence recurrent state (hybrids): ``keep(seq, rows_kept)``
    resolves a sequence's last verify (returns the rollback mode) and ``release(seq)`` frees its
    state slot; ``row_invariant = False`` asks for prefills in one piece (as the solo run);
    ``resumes_prefix = False`` (with ``prefix_refusal``, the reason) refuses cached prefixes.
    """

    num_blocks: int
    block_size: int
    max_batch_rows: int  # the most rows one forward takes (prefills go in chunks of it)

    def forward(self, batch: Sequence[PagedRows]) -> list[tuple["torch.Tensor", "torch.Tensor | None"]]:
        """Per sequence: (logits [rows or 1, vocab], hidden [rows, spec_feature_size] or None).
        Writes the new rows' KV into their blocks (the caller made them writable)."""
        ...

    def copy_block(self, src: int, dst: int) -> None: ...


@runtime_checkable
class BatchedSpeculativeTarget(SpeculativeTarget, Protocol):
    """A target that can also serve many sequences over a paged KV (serving, continuous batching).

    ``spec_open_paged`` raises ValueError with a reason when this load of the model cannot
    (e.g. not on its batch-invariant path). ``BatchedSpecTrunk``
    (``tsspec.runtime.batched_trunk``) binds one sequence of it for the shared loop.
    """

    def spec_kv_bytes_per_block(self, block_size: int) -> int: ...

    def spec_open_paged(self, num_blocks: int, block_size: int) -> PagedKV: ...


@runtime_checkable
class SpecTrunk(Protocol):
    """The seam the loop drives: the target's own members, nothing renamed. A
    ``SpeculativeTarget`` is a trunk as it is (its linear cache); ``BatchedSpecTrunk`` offers the
    same members for one sequence of a ``BatchedSpeculativeTarget``'s paged KV.

    The loop calls ``spec_forward`` then exactly one ``spec_keep(rows_kept)`` (its one rollback
    call), and ``spec_rewind_cache`` between sequences; see ``SpeculativeTarget``.
    """

    @property
    def cache_seq_len(self) -> int: ...

    @property
    def max_context_length(self) -> int: ...

    @property
    def spec_feature_size(self) -> int: ...

    def spec_ensure_capacity(self, required_seq_len: int) -> None: ...

    def spec_forward(
        self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool
    ) -> tuple["torch.Tensor", "torch.Tensor | None"]: ...

    def spec_keep(self, rows_kept: int) -> "str | None": ...

    def spec_rewind_cache(self, length: int) -> None: ...


@runtime_checkable
class Speculator(Protocol):
    """An algorithm: proposes drafts. It is free to be wrong, not to be slow.

    Required: ``name`` and ``propose(ctx)``. Every other member is optional, with its default
    in ONE place, ``tsspec.capabilities.SpeculatorInfo``; a member of the wrong type is a named
    ``ContractError`` when the registry makes the speculator. The optional members: the
    specification's ``max_draft_tokens``, ``min_draft_prob`` (MinDraftProb, set by the registry
    to the gate in force), ``default_min_draft_prob`` (DefaultMinDraftProb), ``needs_hidden_state``,
    ``handles_own_prefill``, ``can_arm_after_prefix_reuse``; the methods ``commit``, ``reset``,
    ``close``.

    ``propose`` may return anything; the loop treats the result as untrusted (ids outside the
    vocabulary, too many tokens or an exception end drafting for that step). An empty list asks
    for a plain one-row step. ``commit(tokens, hidden_rows, start_pos)``: ``tokens`` now sit in
    the trunk at ``start_pos ..``; row k of ``hidden_rows`` [n, spec_feature_size] (None unless
    ``needs_hidden_state``) is the trunk row that PREDICTED ``tokens[k]``, i.e. the row of position
    ``start_pos + k - 1`` (zeros for position 0, which has no predecessor).
    """

    name: str

    def propose(self, ctx: DraftContext) -> list[int]: ...
