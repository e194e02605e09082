"""The one reader of what a plugin's objects offer: typed capability records with their defaults.

Each optional member is read once here, type-checked and defaulted: ``SpeculatorInfo``,
``TargetInfo`` / ``DrafterInfo``, ``PagedInfo``. A wrong type is a ``ContractError`` naming it."""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs

from .errors import TsspecError
from .protocols import DraftHeadKind



class ContractError(TsspecError):
    """A plugin object lacks a member the contract requires, or has one of the wrong type."""


def _nothing(*_: Any) -> None:
    return None


@attrs.frozen
class SpeculatorInfo:
    """A speculator as the loop sees it. ``min_draft_prob`` (MinDraftProb) is the gate in force:
    ``--spec-pmin``, else ``default_min_draft_prob`` (DefaultMinDraftProb)."""

    name: str
    propose: Callable[..., Any]
    max_draft_tokens: int | None = None  # None: the loop's window alone caps a draft
    default_min_draft_prob: float = 0.0
    min_draft_prob: float = 0.0
    needs_hidden_state: bool = False
    handles_own_prefill: bool = False  # True: the loop does not commit the prompt to it
    can_arm_after_prefix_reuse: bool = False
    commit: Callable[[Any, Any, int], None] = _nothing
    reset: Callable[[], None] = _nothing
    close: Callable[[], None] = _nothing


# member -> (kind, what a wrong value is told it should be); kinds: bool, prob, int>=0/None
_FACTS = {
    "max_draft_tokens": ("count", "a whole number >= 0 or None"),
    "default_min_draft_prob": ("prob", "a number in [0, 1]"),
    "needs_hidden_state": ("bool", "True or False"),
    "handles_own_prefill": ("bool", "True or False"),
    "can_arm_after_prefix_reuse": ("bool", "True or False"),
}
_METHODS = ("commit", "reset", "close")


def _valid(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "prob":
        return (not isinstance(value, bool) and isinstance(value, (int, float))
                and math.isfinite(value) and 0.0 <= value <= 1.0)
    if value is None:
        return True
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _member(obj: Any, name: str, owner: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception as exc:
        raise ContractError(f"{owner}: reading {name} raised {type(exc).__name__}: {exc}") from None


def check_speculator_class(obj: Any, label: str = "speculator") -> None:
    """``ContractError`` naming a speculator's first missing or wrong member (a class may omit ``name``)."""
    name = _member(obj, "name", label)
    if not (isinstance(name, str) and name) and not (isinstance(obj, type) and name is None):
        raise ContractError(f"{label}: has no name (a non-empty str attribute)")
    owner = f"speculator {name!r}" if name else label
    if not callable(_member(obj, "propose", owner)):
        raise ContractError(f"{owner}: has no callable propose(ctx)")
    for fact, (kind, told) in _FACTS.items():
        value = _member(obj, fact, owner)
        if isinstance(value, property) or (value is None and fact != "max_draft_tokens"):
            continue  # a class's property is read on the instance; absent: the default
        if not _valid(kind, value):
            raise ContractError(f"{owner}: {fact} must be {told}, got {value!r}")
    for method in _METHODS:
        value = _member(obj, method, owner)
        if value is not None and not callable(value):
            raise ContractError(f"{owner}: {method} must be a method, got {type(value).__name__}")


def apply_gate(spec: Any, info: SpeculatorInfo, pmin: float | None) -> SpeculatorInfo:
    """Set ``min_draft_prob`` to the operator's ``pmin``, else the default; the info with that gate."""
    gate = info.default_min_draft_prob if pmin is None else float(pmin)
    if getattr(spec, "min_draft_prob", None) is not None:
        try:
            spec.min_draft_prob = gate
        except Exception as exc:
            raise ContractError(f"speculator {info.name!r}: min_draft_prob cannot be set ({exc})") from None
    return attrs.evolve(info, min_draft_prob=gate)


def speculator_info(spec: Any) -> SpeculatorInfo:
    """Read a speculator once: its facts and methods, defaults for what it leaves out."""
    check_speculator_class(spec)
    facts = {}
    for fact in _FACTS:
        value = getattr(spec, fact, None)
        if value is not None:
            facts[fact] = value
    default_gate = float(facts.get("default_min_draft_prob", 0.0))
    own = getattr(spec, "min_draft_prob", None)
    gate = own if _valid("prob", own) else default_gate
    methods = {m: getattr(spec, m) for m in _METHODS if getattr(spec, m, None) is not None}
    return SpeculatorInfo(name=spec.name, propose=spec.propose, **facts, **methods, min_draft_prob=float(gate))


@attrs.frozen
class DrafterInfo:
    """The facts of a draft head attached to a target (``target.draft_head``)."""

    kind: DraftHeadKind = DraftHeadKind.NONE
    block_size: int = 1
    resumes_after_gap: bool = False  # may draft after a KV prefix it never saw
    auto_fallback: bool = False  # `auto` puts the preferred weight-free algorithm in front of it
    source: str | None = None  # where it came from, for display ("bundled: ...", a file)


@attrs.frozen
class TargetInfo:
    """The optional facts of a target, with the defaults of a plain KV model."""

    speculation_profitable: bool = True  # False: its trunk cannot verify without its drafter
    speculation_refusal: str | None = None  # refuses speculation outright, with this reason
    preferred_draft_window: int | None = None  # narrows the default window (hybrids)
    verify_persists_accepted_kv: bool = False  # a rejected tail is undone by a KV rewind
    batched: bool = False  # a BatchedSpeculativeTarget (offers spec_open_paged)
    # hidden rows can be the residuals entering chosen layers (spec_set_feature_taps): what
    # drafters reading several layers (DFlash, EAGLE-3-style heads) need
    feature_taps: bool = False
    drafter: DrafterInfo = DrafterInfo()
    draft_head_absence: str | None = None  # why it carries no draft head (absent, or not loaded)


def drafter_info(head: Any) -> DrafterInfo:
    """A draft head's facts (``DrafterInfo()`` for None)."""
    if head is None:
        return DrafterInfo()
    kind = getattr(head, "kind", DraftHeadKind.NONE)
    source = getattr(head, "source", None)
    return DrafterInfo(
        kind=kind if isinstance(kind, DraftHeadKind) else DraftHeadKind.NONE,
        block_size=int(getattr(head, "block_size", 1) or 1),
        resumes_after_gap=getattr(head, "resumes_after_gap", False) is True,
        auto_fallback=getattr(head, "auto_fallback", False) is True,
        source=None if source is None else str(source),
    )


def target_info(target: Any) -> TargetInfo:
    """A target's optional facts, read now (they may change: a drafter attached later)."""
    refusal = getattr(target, "speculation_refusal", None)
    window = getattr(target, "spec_preferred_draft_window", None)
    return TargetInfo(
        speculation_profitable=getattr(target, "speculation_profitable", True) is not False,
        speculation_refusal=str(refusal) if refusal else None,
        preferred_draft_window=window if isinstance(window, int) and window > 0 else None,
        verify_persists_accepted_kv=getattr(target, "spec_verify_persists_accepted_kv", False) is True,
        batched=callable(getattr(target, "spec_open_paged", None)),
        feature_taps=callable(getattr(target, "spec_set_feature_taps", None)),
        drafter=drafter_info(getattr(target, "draft_head", None)),
        draft_head_absence=str(absence) if (absence := getattr(target, "spec_draft_head_absence", None)) else None,
    )


def verify_cost_shape(target: Any) -> Any:
    """The target's optional ``spec_verify_row_ms`` (cost by rows), or None."""
    try:
        return getattr(target, "spec_verify_row_ms", None)
    except Exception:
        return None


_NO_PREFIX = "the paged KV cannot resume a prefix"


@attrs.frozen
class PagedInfo:
    """A paged KV's optional members (hybrids): ``keep``/``release`` and its refusals."""

    row_invariant: bool = True
    resumes_prefix: bool = True
    prefix_refusal: str = _NO_PREFIX
    keep: Callable[[int, int], Any] | None = None  # keep(seq, rows_kept) -> mode
    release: Callable[[int], None] | None = None  # release(seq)


def paged_info(kv: Any) -> PagedInfo:
    """What a ``PagedKV`` offers beyond the protocol's required members."""
    keep, release = getattr(kv, "keep", None), getattr(kv, "release", None)
    return PagedInfo(
        row_invariant=getattr(kv, "row_invariant", True) is not False,
        resumes_prefix=getattr(kv, "resumes_prefix", True) is not False,
        prefix_refusal=str(getattr(kv, "prefix_refusal", "") or _NO_PREFIX),
        keep=keep if callable(keep) else None,
        release=release if callable(release) else None,
    )


def trunk_extras(trunk: Any) -> tuple[int, float]:
    """(positions adopted from a prefix cache, the last verify's extra cost in ms to its batch)."""
    adopted = getattr(trunk, "adopted_prefix", 0) or 0
    extra = getattr(trunk, "extra_cost_ms", 0.0) or 0.0
    return int(adopted), float(extra)
