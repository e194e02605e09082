"""The untrusted proposal as the loop sees it: checked ids, fault kinds, the history view it lends."""

from __future__ import annotations

import itertools
import operator
from typing import Sequence

from ..protocols import Proposal
from .calibration import valid_confidences

MAX_FAULTS = 3  # faults in one sequence before the speculator is parked for it

# fault kinds, as counted in SpecStats.fault_kinds
PROPOSE_RAISED = "propose_raised"
COMMIT_RAISED = "commit_raised"
BAD_TYPE = "bad_type"
BAD_ID = "bad_id"
OUT_OF_VOCAB = "out_of_vocab"
TOO_MANY = "too_many_tokens"
BAD_CONFIDENCE = "bad_confidence"


def proposal_confidence(raw: object, length: int) -> tuple[list[float] | None, str | None]:
    """The proposal's per-draft ``confidence`` (None: none), or (None, fault) when it is not ``length``
    floats in [0, 1]. Never raises."""
    if raw is None or isinstance(raw, list) and type(raw) is list:
        return None, None
    if type(raw) is Proposal:  # its own slot, a list of floats when given (the common form)
        values = raw.confidence
        if values is None:
            return None, None
        if type(values) is list and len(values) == length:
            for v in values:
                if type(v) is not float or not 0.0 <= v <= 1.0:
                    break
            else:
                return list(values), None
    try:
        values = getattr(raw, "confidence", None)
    except Exception:
        return None, BAD_CONFIDENCE
    if values is None:
        return None, None
    checked = valid_confidences(values, length)
    return (checked, None) if checked is not None else (None, BAD_CONFIDENCE)


def validate_proposal(raw: object, max_tokens: int, vocab_size: int) -> tuple[list[int], str | None]:
    """An untrusted proposal as a list of ids, or ([], fault kind), whatever its methods do.

    >>> validate_proposal([3, 4], 8, 10), validate_proposal([3, 99], 8, 10)
    (([3, 4], None), ([], 'out_of_vocab'))"""
    if raw is None:
        return [], None
    if type(raw) is list or type(raw) is Proposal:
        # the common forms: list's own length and iteration, so none of the proposal's code
        # runs; ids that are plain ints in range pass here, anything else takes the checks below
        if len(raw) > max_tokens:
            return [], TOO_MANY
        ids = list(raw)
        for value in ids:
            if type(value) is not int or not 0 <= value < vocab_size:
                break
        else:
            return ids, None
    try:  # hasattr / len run the proposal's own code, which may raise anything
        if isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__") or not hasattr(raw, "__iter__"):
            return [], BAD_TYPE
        n = len(raw)
    except Exception:
        return [], BAD_TYPE
    if n > max_tokens:
        return [], TOO_MANY
    ids: list[int] = []
    try:
        # never iterate past the claimed length: an iterator that yields more is lying
        for item in itertools.islice(raw, n + 1):
            if len(ids) == n:
                return [], BAD_TYPE
            if isinstance(item, bool):
                return [], BAD_ID
            try:
                value = operator.index(item)  # ints, numpy ints, 0-d int tensors; never floats
            except Exception:
                return [], BAD_ID
            if not 0 <= value < vocab_size:
                return [], OUT_OF_VOCAB
            ids.append(value)
    except Exception:  # the iterator itself raised
        return [], BAD_TYPE
    return ids, None


class HistoryView(Sequence[int]):
    """A read-only view of the sequence, lent to ``propose`` without a copy."""

    __slots__ = ("_items",)

    def __init__(self, items: list[int]):
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index):
        return self._items[index]

    def __iter__(self):
        return iter(self._items)

    def __repr__(self) -> str:
        return f"HistoryView(len={len(self._items)})"
