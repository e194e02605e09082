"""The paired runner: plain and speculative configurations alternating in one process.

Single runs on a noisy machine mislead; ratios of neighbouring runs do not, because whatever
slows the machine (another process, thermal state, a page-cache miss) slows both sides of a
pair alike. So, after one untimed warm-up round, every case runs ``reps`` rounds of every
configuration back to back, and each run is paired with the plain run of its own round. The
order flips every round (``plain, c1, .., control`` then ``control, .., c1, plain``), so no
configuration always runs first. The control is plain decoding again, last in the list: its
ratio to plain is what noise alone does to a pair (``summary.control_band``).

Every speculative run is checked against the case's plain reference (the first plain run of
that case): identical, or a float tie at the first divergence (see ``lossless``). A real
mismatch is recorded and reported; the command turns it into exit code 1.
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.registry import Decline
from tsspec.runtime.sampling import SamplingParams
from tsspec.runtime.stats import SpecStats
from .lossless import IDENTICAL, LosslessVerdict, check_lossless
from .prompts import EncodedCase

PLAIN, CONTROL, ALGORITHM, ORACLE = "plain", "control", "algorithm", "oracle"
WARMUP_REP = -1  # the rep number of warm-up runs (untimed: not in any summary)
NO_GOVERNOR_SUFFIX = "/no-governor"
DRAFT_CAP_SUFFIX = "/draft"  # oracle@0.50/draft2: the oracle drafting at most 2 tokens a step


@attrs.frozen
class BenchConfig:
    """One configuration to measure: plain decoding, a registered algorithm, or the oracle."""

    name: str  # "plain", "ngram", "oracle@0.50"
    kind: str  # plain | algorithm | oracle
    algorithm: str | None = None  # registry name (kind algorithm)
    acceptance: float | None = None  # target per-token acceptance (kind oracle)
    adaptive: bool | None = None  # cost governor on/off; None: the bench's options decide
    classes: frozenset[str] | None = None  # prompt classes it runs on; None: all
    max_draft: int | None = None  # the oracle's drafts capped at this many tokens; None: the window

    @classmethod
    def plain(cls) -> "BenchConfig":
        return cls(PLAIN, PLAIN)

    @classmethod
    def control(cls) -> "BenchConfig":
        """Plain decoding a second time, paired with plain like any configuration."""
        return cls(CONTROL, CONTROL)

    @classmethod
    def for_algorithm(cls, name: str, *, adaptive: bool | None = None) -> "BenchConfig":
        suffix = "" if adaptive is None else ("" if adaptive else NO_GOVERNOR_SUFFIX)
        return cls(name + suffix, ALGORITHM, algorithm=name, adaptive=adaptive)

    @classmethod
    def oracle(cls, acceptance: float, *, adaptive: bool | None = None, classes=None,
               max_draft: int | None = None) -> "BenchConfig":
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"oracle acceptance must be between 0 and 1, got {acceptance}")
        if max_draft is not None and max_draft < 1:
            raise ValueError(f"an oracle's draft cap must be at least 1, got {max_draft}")
        suffix = "" if adaptive is None or adaptive else NO_GOVERNOR_SUFFIX
        capped = "" if max_draft is None else f"{DRAFT_CAP_SUFFIX}{max_draft}"
        return cls(f"oracle@{acceptance:.2f}{capped}{suffix}", ORACLE, acceptance=acceptance, adaptive=adaptive,
                   classes=None if classes is None else frozenset(classes), max_draft=max_draft)

    @property
    def speculative(self) -> bool:
        return self.kind not in (PLAIN, CONTROL)

    def runs_on(self, cls: str) -> bool:
        return self.classes is None or cls in self.classes


@attrs.frozen
class Slot:
    """One scheduled run: which case, which round, which configuration."""

    case: int  # index into the cases
    rep: int  # round number; WARMUP_REP for the warm-up round
    config: int  # index into the configurations (0 is plain)


def schedule(n_cases: int, n_configs: int, reps: int, *, warmup: bool = True,
             runs_on: Callable[[int, int], bool] | None = None) -> list[Slot]:
    """The run order: a warm-up round on the first case, then per case ``reps`` rounds of every
    configuration, in list order in even rounds and reversed in odd ones (a case's first round
    starts with plain, its reference). ``runs_on(case, config)`` drops configurations from
    cases they do not apply to.

    >>> [(s.case, s.rep, s.config) for s in schedule(2, 2, 2, warmup=False)]
    [(0, 0, 0), (0, 0, 1), (0, 1, 1), (0, 1, 0), (1, 0, 0), (1, 0, 1), (1, 1, 1), (1, 1, 0)]
    """
    keep = runs_on or (lambda case, config: True)
    slots = []
    if warmup and n_cases:
        slots = [Slot(0, WARMUP_REP, c) for c in range(n_configs)]
    for case in range(n_cases):
        for rep in range(reps):
            order = range(n_configs) if rep % 2 == 0 else range(n_configs - 1, -1, -1)
            slots.extend(Slot(case, rep, c) for c in order if c == 0 or keep(case, c))
    return slots


@attrs.define
class RunRecord:
    """One measured generation."""

    case_id: str
    cls: str
    config: str
    kind: str
    rep: int
    order: int  # position in the executed schedule
    tokens: list[int]
    stats: SpecStats
    speculator: str | None
    verdict: LosslessVerdict | None = None  # speculative runs (and repeated plain runs)
    acceptance_target: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.stats.tokens_per_second

    @property
    def warmup(self) -> bool:
        return self.rep == WARMUP_REP

    def to_json(self) -> dict:
        return {
            "case": self.case_id,
            "class": self.cls,
            "config": self.config,
            "kind": self.kind,
            "rep": self.rep,
            "order": self.order,
            "emitted": len(self.tokens),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "speculator": self.speculator,
            "acceptance_target": self.acceptance_target,
            "lossless": None if self.verdict is None else self.verdict.to_json(),
            "stats": self.stats.to_json(),
        }


class ConfigDeclined(Exception):
    """A requested algorithm does not serve the model (carries the registry's Decline)."""

    def __init__(self, config: str, decline: Decline):
        self.config = config
        self.decline = decline
        super().__init__(f"{config}: {decline.code}: {decline.reason}")


@attrs.define
class BenchRunner:
    """Runs a schedule on one target. ``run_one`` is the seam tests use to inject faults."""

    target: object
    cases: Sequence[EncodedCase]
    configs: Sequence[BenchConfig]
    reps: int = 5
    options: SpeculationOptions = attrs.field(factory=SpeculationOptions)
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    registry: object = None
    warmup: bool = True
    on_run: Callable[[Slot, RunRecord], None] | None = None  # progress callback
    on_mismatch: Callable[[RunRecord], None] | None = None
    clock: Callable[[], float] | None = None  # the loop's clock (None: perf_counter)
    heads: object = None  # a drafters.HeadSwitch: each configuration's drafter (None: the loaded one)
    records: list[RunRecord] = attrs.field(factory=list)
    references: dict[str, list[int]] = attrs.field(factory=dict)  # case id -> plain tokens

    def __attrs_post_init__(self):
        if not self.configs or self.configs[0].kind != PLAIN:
            raise ValueError("the first configuration must be plain decoding (the pairs' partner)")
        if self.reps < 1:
            raise ValueError(f"reps must be >= 1, got {self.reps}")

    def slots(self) -> list[Slot]:
        return schedule(
            len(self.cases), len(self.configs), self.reps, warmup=self.warmup,
            runs_on=lambda case, config: self.configs[config].runs_on(self.cases[case].cls),
        )

    def run(self) -> list[RunRecord]:
        for order, slot in enumerate(self.slots()):
            record = self.run_slot(slot, order)
            self.records.append(record)
            if self.on_run is not None:
                self.on_run(slot, record)
        return self.records

    # -- one run ---------------------------------------------------------------------------
    def _options(self, config: BenchConfig) -> SpeculationOptions:
        if not config.speculative:
            return attrs.evolve(self.options, enabled=False)
        adaptive = self.options.adaptive if config.adaptive is None else config.adaptive
        if config.kind == ALGORITHM:
            return attrs.evolve(self.options, enabled=True, spec_type=config.algorithm, adaptive=adaptive)
        return attrs.evolve(self.options, enabled=True, adaptive=adaptive)

    def _speculator(self, config: BenchConfig, case: EncodedCase):
        if config.kind != ORACLE:
            return None
        from tsspec.testing import OracleSpeculator

        reference = self.references[case.id]
        from tsspec.capabilities import target_info

        window = self.options.window(target_info(self.target).preferred_draft_window)
        if config.max_draft is not None:  # the loop's window follows the speculator's max_draft_tokens
            window = min(window, config.max_draft)
        return OracleSpeculator(
            list(case.prompt_ids) + reference,
            corrupt=1.0 - float(config.acceptance),
            vocab_size=self.target.config.vocab_size,
            max_draft_tokens=window,
        )

    def run_one(self, config: BenchConfig, case: EncodedCase):
        """One generation: returns the runtime's ``Generation``."""
        if self.heads is not None:
            self.heads.use(config.name)
        forget = getattr(self.registry, "forget", None)
        if forget is not None:  # each run is a fresh request, as one `tsspec generate` is: no park
            forget(self.target)  # carried over from the run before (the order of runs is not data)
        result = generate(
            self.target,
            list(case.prompt_ids),
            self._options(config),
            max_tokens=case.max_tokens,
            sampling=self.sampling,
            speculator=self._speculator(config, case),
            registry=self.registry,
            clock=self.clock,
        )
        if config.kind == ALGORITHM and result.decline is not None:
            raise ConfigDeclined(config.name, result.decline)
        return result

    def run_slot(self, slot: Slot, order: int) -> RunRecord:
        case, config = self.cases[slot.case], self.configs[slot.config]
        result = self.run_one(config, case)
        record = RunRecord(
            case.id, case.cls, config.name, config.kind, slot.rep, order, list(result.tokens),
            result.stats, result.speculator, acceptance_target=config.acceptance,
        )
        reference = self.references.get(case.id)
        if reference is None:
            if config.kind != PLAIN:  # cannot happen: plain is first in a case's first round
                raise RuntimeError("a speculative run before its case's plain reference")
            self.references[case.id] = record.tokens
            record.verdict = LosslessVerdict(IDENTICAL)
            return record
        record.verdict = check_lossless(self.target, case.prompt_ids, reference, record.tokens, self.sampling)
        if not record.verdict.ok and self.on_mismatch is not None:
            self.on_mismatch(record)
        return record

    @property
    def mismatches(self) -> list[RunRecord]:
        return [r for r in self.records if r.verdict is not None and not r.verdict.ok]
