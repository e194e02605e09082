"""Per prompt class and configuration: the figures the report prints.

Speed is the median of tok/s over the timed runs; the speed-up is the median (and min, max) of
the per-pair ratios speculative / plain, a pair being the two runs of one case in one round.
Counters (acceptance, tokens per verify, accepted per position, governor) are sums over the
runs, so a class with more steps weighs more, as it does for a user. The control row (plain
against plain) gives the band of ratios noise alone produces (``NoiseBand``): a median inside
it is no difference, one above it a win, one below it a loss.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Sequence

import attrs

from tsspec.runtime.stats import PHASES, SpecStats
from .lossless import IDENTICAL, MISMATCH, TIE
from .runner import CONTROL, PLAIN, RunRecord

ALL_CLASSES = "all"


@attrs.define
class SummaryRow:
    """One (class, configuration) cell of the report."""

    cls: str
    config: str
    kind: str
    runs: int
    tokens_per_second: float  # median over runs
    plain_tokens_per_second: float  # median over this class's plain runs
    ratio_median: float | None  # speculative / plain, per pair
    ratio_min: float | None
    ratio_max: float | None
    pairs: int
    acceptance_rate: float
    tokens_per_verify: float
    accepted_per_position: list[float]  # [k]: fraction of drafts whose token k was accepted
    draft_tokens: int
    accepted_tokens: int
    phase_ms: dict[str, float]  # mean per run
    governor_wins: int
    governor_losses: int
    governor_parked_steps: int
    steps: int
    verify_steps: int
    plain_steps: int
    identical: int
    ties: int
    mismatches: int
    acceptance_target: float | None = None
    declined_drafts: int = 0  # confidence-carrying proposals the calibration did not verify (plain steps)

    def to_json(self) -> dict:
        data = attrs.asdict(self)
        for key in ("tokens_per_second", "plain_tokens_per_second", "ratio_median", "ratio_min",
                    "ratio_max", "acceptance_rate", "tokens_per_verify"):
            if data[key] is not None:
                data[key] = round(data[key], 4)
        data["accepted_per_position"] = [round(x, 4) for x in self.accepted_per_position]
        data["phase_ms"] = {k: round(v, 2) for k, v in self.phase_ms.items()}
        data["class"] = data.pop("cls")
        return data

    @property
    def verify_ms_per_step(self) -> float:
        return self.phase_ms.get("verify", 0.0) * self.runs / self.verify_steps if self.verify_steps else 0.0

    @property
    def plain_ms_per_step(self) -> float:
        return self.phase_ms.get("plain", 0.0) * self.runs / self.plain_steps if self.plain_steps else 0.0


MIN_BAND_PAIRS = 3  # control pairs behind a noise band that calls wins and losses


@attrs.frozen
class NoiseBand:
    """The spread (min-max) of the control row's pair ratios, over all classes."""

    low: float
    high: float
    pairs: int

    @property
    def judges(self) -> bool:
        """Enough control pairs for a spread: one pair's min-max is a single ratio, not noise."""
        return self.pairs >= MIN_BAND_PAIRS

    def verdict(self, ratio: float) -> str:
        """'wins' above the band, 'loses' below it, 'within noise' inside it; 'unjudged' when
        the band rests on fewer than MIN_BAND_PAIRS pairs.

        >>> band = NoiseBand(0.92, 1.07, 12)
        >>> band.verdict(1.10), band.verdict(1.05), band.verdict(0.90)
        ('wins', 'within noise', 'loses')
        >>> NoiseBand(1.01, 1.01, 1).verdict(1.15)
        'unjudged'
        """
        if not self.judges:
            return "unjudged"
        if ratio > self.high:
            return "wins"
        return "loses" if ratio < self.low else "within noise"

    def text(self) -> str:
        return f"{self.low:.2f}-{self.high:.2f} over {self.pairs} plain/plain pairs"

    def to_json(self) -> dict:
        return {"low": round(self.low, 4), "high": round(self.high, 4), "pairs": self.pairs}


def control_band(rows: Sequence["SummaryRow"]) -> NoiseBand | None:
    """The control row's band (None: no control row, or no pair in it)."""
    row = next((r for r in rows if r.kind == CONTROL and r.cls == ALL_CLASSES), None)
    if row is None or not row.pairs or row.ratio_min is None:
        return None
    return NoiseBand(row.ratio_min, row.ratio_max, row.pairs)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _merge(stats: Iterable[SpecStats]) -> SpecStats:
    total = SpecStats()
    for s in stats:
        total = total.merge(s)
    return total


def pair_ratios(records: Sequence[RunRecord], config: str) -> list[float]:
    """speculative tok/s / plain tok/s for every (case, rep) where both ran."""
    plain = {(r.case_id, r.rep): r.tokens_per_second for r in records if r.kind == PLAIN}
    out = []
    for r in records:
        if r.config != config:
            continue
        base = plain.get((r.case_id, r.rep))
        if base:
            out.append(r.tokens_per_second / base)
    return out


def summarise_cell(records: Sequence[RunRecord], cls: str, config: str) -> SummaryRow | None:
    """The row for one class ('all' = every class) and configuration over timed runs."""
    timed = [r for r in records if not r.warmup and (cls == ALL_CLASSES or r.cls == cls)]
    mine = [r for r in timed if r.config == config]
    if not mine:
        return None
    plain_runs = [r for r in timed if r.kind == PLAIN]
    merged = _merge(r.stats for r in mine)
    ratios = pair_ratios(timed, config) if mine[0].kind != PLAIN else []
    drafts = merged.drafts
    verdicts = [r.verdict.status for r in mine if r.verdict is not None]
    return SummaryRow(
        cls=cls,
        config=config,
        kind=mine[0].kind,
        runs=len(mine),
        tokens_per_second=_median([r.tokens_per_second for r in mine]),
        plain_tokens_per_second=_median([r.tokens_per_second for r in plain_runs]),
        ratio_median=_median(ratios) if ratios else None,
        ratio_min=min(ratios) if ratios else None,
        ratio_max=max(ratios) if ratios else None,
        pairs=len(ratios),
        acceptance_rate=merged.acceptance_rate,
        tokens_per_verify=merged.tokens_per_verify,
        accepted_per_position=[n / drafts for n in merged.accepted_per_position] if drafts else [],
        draft_tokens=merged.draft_tokens,
        accepted_tokens=merged.accepted_tokens,
        phase_ms={p: merged.phase_ms.get(p, 0.0) / len(mine) for p in PHASES},
        governor_wins=merged.governor_wins,
        governor_losses=merged.governor_losses,
        governor_parked_steps=merged.governor_parked_steps,
        steps=merged.steps,
        verify_steps=merged.verify_steps,
        plain_steps=merged.plain_steps,
        identical=verdicts.count(IDENTICAL),
        ties=verdicts.count(TIE),
        mismatches=verdicts.count(MISMATCH),
        acceptance_target=mine[0].acceptance_target,
        declined_drafts=merged.declined_drafts,
    )


def summarise(records: Sequence[RunRecord], configs: Sequence[str], classes: Sequence[str]) -> list[SummaryRow]:
    """Rows for every class (in the given order, then 'all') and configuration."""
    rows = []
    for cls in [*classes, ALL_CLASSES]:
        for config in configs:
            row = summarise_cell(records, cls, config)
            if row is not None:
                rows.append(row)
    return rows
