"""Plain decoding in a second arithmetic beside the bench's own, paired with llama.cpp's plain runs.

Goal 2 (plain decode at least 1.2x llama.cpp) is measured on the arithmetic the bench loaded
(the default: float32 multiply-adds on the file's blocks). llama.cpp quantises activations to 8
bits for a Q4_1 file (its Q8_1 dot products), so the bench also runs tsspec with ``--dtype int8``
(the same arithmetic: activation rows quantised per 32 values, exact integer dots) beside it: the
second target's plain run follows llama.cpp's plain run of the same prompt and round, so its
ratio is a median of paired ratios like goal 2's, and its output is compared with llama.cpp's.
"""

from __future__ import annotations

import statistics
from typing import Sequence

import attrs

SECOND_DTYPE = "int8"  # the --dtype of the row beside goal 2 (llama.cpp's arithmetic)


@attrs.define
class PrecisionRun:
    """One plain run of the second-arithmetic target, with the llama.cpp plain run it follows."""

    case_id: str
    cls: str
    rep: int  # -1: warm-up
    tokens: list[int]
    tokens_per_second: float
    peer_tokens: list[int]
    peer_tokens_per_second: float
    peer_variant: str | None = None
    reference: list[int] | None = None  # the bench target's plain output of the case

    def to_json(self) -> dict:
        return {"case": self.case_id, "class": self.cls, "rep": self.rep, "emitted": len(self.tokens),
                "tokens_per_second": round(self.tokens_per_second, 3),
                "peer_tokens_per_second": round(self.peer_tokens_per_second, 3), "peer_variant": self.peer_variant,
                "same_as_peer": self.tokens == self.peer_tokens,
                "same_as_reference": None if self.reference is None else self.tokens == self.reference}


def summarise(runs: Sequence[PrecisionRun], dtype: str, arithmetic: str | None) -> dict:
    """Medians over the timed runs: tok/s of both, the paired ratio, and how many outputs equal
    llama.cpp's and the bench target's own plain output.

    >>> r = [PrecisionRun("a", "qa", 0, [1, 2], 120.0, [1, 2], 100.0, reference=[1, 3]),
    ...      PrecisionRun("a", "qa", 1, [1, 2], 90.0, [1, 2], 100.0, reference=[1, 3])]
    >>> s = summarise(r, "int8", "int8")
    >>> s["pairs"], round(s["ratio"], 2), s["same_as_peer"], s["same_as_reference"]
    (2, 1.05, 2, 0)
    """
    timed = [r for r in runs if r.rep >= 0 and r.tokens_per_second and r.peer_tokens_per_second]
    out = {"dtype": dtype, "arithmetic": arithmetic, "pairs": len(timed), "runs": [r.to_json() for r in runs]}
    if timed:
        out.update(
            tokens_per_second=statistics.median(r.tokens_per_second for r in timed),
            peer_tokens_per_second=statistics.median(r.peer_tokens_per_second for r in timed),
            ratio=statistics.median(r.tokens_per_second / r.peer_tokens_per_second for r in timed),
            same_as_peer=sum(r.tokens == r.peer_tokens for r in timed),
            same_as_reference=sum(r.reference is not None and r.tokens == r.reference for r in timed),
            peer_variant=next((r.peer_variant for r in timed if r.peer_variant), None),
        )
    return out
