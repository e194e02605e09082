"""The public contracts: ``SpeculativeTarget`` (a model adapter: a multi-row forward with per-row
logits plus rollback), ``Speculator`` (an algorithm: how drafts are proposed) and ``DraftHead``
(trained drafter weights attached to one target). All structural (``typing.Protocol``)."""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

import attrs

if TYPE_CHECKING:  # torch is only needed for annotations here: importing protocols stays cheap
    import torch



class SpeculatorDeclined(Exception):
    """Raised by a factory that cannot serve a target: a ``cannot_serve`` decline with its message."""


def require_feature_width(target: Any, width: int, reader: str, hint: str = "") -> None:
    """Decline unless the target's hidden rows are ``width`` wide."""
    have = int(target.spec_feature_size)
    if have != int(width):
        raise SpeculatorDeclined(
            f"the model's hidden rows are {have} wide but {reader} reads {int(width)}"
            + (f" ({hint})" if hint else "")
        )


def resolve_feature_taps(layers: Sequence[int] | None, num_layers: int) -> tuple[int, ...] | None:
    """What ``spec_set_feature_taps(layers)`` stores: None for no layers, else the layer ids (each in
    ``0..num_layers``, ValueError otherwise).

    >>> resolve_feature_taps([2, 0], 4), resolve_feature_taps([], 4)
    ((2, 0), None)"""
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
    """``history`` then ``drafts`` without copying the history (what ``adjust_logits`` reads).

    >>> PrecedingTokens([1, 2, 3], [7, 8])[-3:]
    [3, 7, 8]"""

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
    """A draft (token ids) with a ``confidence`` in [0, 1] per token, the drafter's own estimate; the
    loop calibrates it in this run and verifies the prefix worth its rows. A plain list is
    verified whole."""

    __slots__ = ("confidence",)

    def __init__(self, tokens: Sequence[int] = (), confidence: Sequence[float] | None = None):
        super().__init__(tokens)
        self.confidence = None if confidence is None else list(confidence)


@attrs.frozen
class DraftContext:
    """Everything a speculator may look at when proposing (one object: new signals become fields).

    ``last_token`` sits at ``position`` and is not yet cached; a draft guesses positions
    ``position+1 ..``; ``history`` ends with ``last_token``. ``window`` is the sequence's draft
    window; ``max_tokens`` this step's cap (window, budget, context, governor): never exceed it."""

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
    """Trained drafter weights bound to one target. Per-token heads implement ``draft_step`` and
    ``draft_catch_up``; block heads ``draft_block``. A head with sequence state may offer
    ``for_sequence()``: a view sharing its weights (docs/plugins.md)."""

    kind: DraftHeadKind
    block_size: int  # tokens per block for BLOCK heads (anchor included); 1 for PER_TOKEN
    resumes_after_gap: bool  # may the head draft after a KV prefix it never saw? (default False)

    def draft_step(
        self, token: int, h_prev: "torch.Tensor", pos: int
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Feed ``token`` at ``pos`` with ``h_prev`` [H]; (logits [vocab] for pos+1, hidden [H])."""
        ...

    def draft_block(
        self, last_token: int, h_prev: "torch.Tensor", position: int, max_tokens: int
    ) -> tuple[list[int], list[float]]:
        """Up to ``max_tokens`` tokens after ``last_token`` in one pass: (tokens, confidences)."""
        ...

    def draft_catch_up(
        self, tokens: Sequence[int], h_rows: "torch.Tensor", start_pos: int
    ) -> None:
        """What landed: tokens at start_pos.., h_rows [n, H] the rows that predicted them."""
        ...

    def reset(self) -> None: ...


_COUNTS_LOCK = threading.Lock()  # every HeadCounts update: a few integer adds under one lock


class HeadCounts:
    """Forwards and rows a draft head ran. A head holds one as ``counts``; a ``for_sequence`` view
    holds ``counts.view()``, whose updates also add to the head's (under one lock: views run in
    threads of their own)."""

    __slots__ = ("calls", "rows", "root")

    def __init__(self, root: "HeadCounts | None" = None):
        self.calls = 0  # forwards run
        self.rows = 0  # rows forwarded (cost accounting)
        self.root = root  # the head's counts a view also adds to; None on the head itself

    def view(self) -> "HeadCounts":
        """Counts for a sequence view that also add to the head's."""
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
class SpecTrunk(Protocol):
    """What the loop drives: a target itself, or a ``BatchedSpecTrunk`` for one paged sequence.

    * ``spec_forward`` appends ``tokens`` at ``cache_seq_len ..``; ``all_logits_rows`` marks a verify.
    * Each forward is followed by ONE ``spec_keep(rows_kept)``: keep the state after the first
      ``rows_kept`` rows (a KV length; a hybrid commits a per-row slot or restores the state saved
      when the verify began and re-forwards). It may return a mode word for the statistics.
    * ``spec_rewind_cache(length)``: ``0`` starts a fresh sequence; other lengths where the KV alone
      holds the state (``spec_verify_persists_accepted_kv``)."""

    @property
    def cache_seq_len(self) -> int: ...

    @property
    def max_context_length(self) -> int: ...

    @property
    def spec_feature_size(self) -> int:
        """hidden_size, or taps x hidden_size when feature taps are set."""
        ...

    def spec_forward(
        self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool
    ) -> tuple["torch.Tensor", "torch.Tensor | None"]:
        """Logits [rows, vocab] ([1, vocab] unless all_logits_rows), hidden [rows, F] or None."""
        ...

    def spec_ensure_capacity(self, required_seq_len: int) -> None: ...

    def spec_keep(self, rows_kept: int) -> "str | None":
        """Keep the state after the first ``rows_kept`` rows of the last forward."""
        ...

    def spec_rewind_cache(self, length: int) -> None: ...


@runtime_checkable
class SpeculativeTarget(SpecTrunk, Protocol):
    """What the shared loop needs from a model (a trunk), and nothing about drafting. Optional
    facts are read through ``tsspec.capabilities.TargetInfo`` (defaults there)."""

    config: ModelConfig
    tokenizer: Tokenizer | None
    draft_head: DraftHead | None  # composition: the drafter is attached, not inherited
    speculation_profitable: bool  # False when the trunk cannot verify without its own drafter
    speculation_refusal: str | None  # a reason the target refuses speculation outright
    spec_preferred_draft_window: int | None  # narrows the default window (e.g. 3 on hybrids)
    spec_verify_persists_accepted_kv: bool  # True: a rejected tail is undone by a KV rewind

    def spec_set_feature_taps(self, layers: Sequence[int] | None) -> None:
        """Hidden rows become the residuals entering ``layers``; None restores the default."""
        ...


@attrs.frozen
class PagedRows:
    """One sequence's part of a batched paged forward: its block table, ``past`` positions already
    in it, the new ``tokens``, and ``seq`` (its stable id)."""

    blocks: Sequence[int]
    past: int
    tokens: Sequence[int]
    all_logits: bool = False
    want_hidden: bool = False
    seq: int = 0


@runtime_checkable
class PagedKV(Protocol):
    """A target's KV in fixed-size blocks and one forward over a ragged batch (block tables are the
    caller's). Optional members for hybrids: see ``tsspec.capabilities.PagedInfo``."""

    num_blocks: int
    block_size: int
    max_batch_rows: int  # the most rows one forward takes (prefills go in chunks of it)

    def forward(self, batch: Sequence[PagedRows]) -> list[tuple["torch.Tensor", "torch.Tensor | None"]]:
        """Per sequence: (logits [rows or 1, vocab], hidden [rows, F] or None)."""
        ...

    def copy_block(self, src: int, dst: int) -> None: ...


@runtime_checkable
class BatchedSpeculativeTarget(SpeculativeTarget, Protocol):
    """A target that also serves many sequences over a paged KV (``spec_open_paged``: ValueError if not)."""

    def spec_kv_bytes_per_block(self, block_size: int) -> int: ...

    def spec_open_paged(self, num_blocks: int, block_size: int) -> PagedKV: ...


@runtime_checkable
class Speculator(Protocol):
    """An algorithm: proposes drafts. It is free to be wrong, not to be slow.

    Required: ``name`` and ``propose(ctx)``; every other member has its default in
    ``tsspec.capabilities.SpeculatorInfo`` (a wrong type is a named ``ContractError``). ``propose``
    is untrusted (bad ids, too many tokens, exceptions end that step's drafting); ``[]`` asks for a
    plain step. ``commit(tokens, hidden_rows, start_pos)``: row k of ``hidden_rows`` predicted
    ``tokens[k]`` (zeros for position 0)."""

    name: str

    def propose(self, ctx: DraftContext) -> list[int]: ...
