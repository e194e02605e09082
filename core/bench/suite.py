"""One benchmark invocation, start to finish: configurations, runs, peers, governor, report.

The CLI parses flags into a ``BenchPlan`` and hands it here with a loaded target; tests build
plans directly. Algorithms come from the registry (every registered algorithm that serves the
model, unless the operator names some), so a newly installed plugin is benchmarked without any
change here.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from pathlib import Path
from typing import Callable, Sequence

import attrs

from .. import __version__
from ..errors import OptionsError
from ..runtime.generation import draft_window
from ..runtime.options import SpeculationOptions
from ..runtime.sampling import SamplingParams
from .machine import describe_machine, load_average
from .prompts import EncodedCase, PromptCase, encode_case
from .report import BenchReport
from .runner import BenchConfig, BenchRunner
from .summary import summarise

RUN_BY_MAKE = "make bench"  # the Makefile target that regenerates BENCHMARKS.md


@attrs.define
class BenchPlan:
    """What to measure."""

    model_name: str
    model_path: str | None  # the GGUF (peers load it); None for the toy
    cases: list[PromptCase]
    prompts_label: str  # "the shipped set (tsspec/data/prompts/bench.jsonl)" or the user's file
    algorithms: list[str] | None = None  # None: every algorithm that serves the model
    oracle_acceptance: list[float] = attrs.field(factory=list)
    oracle_classes: list[str] | None = None
    oracle_governor: tuple[bool | None, ...] = (None,)  # governor settings of the sweep (None: options')
    reps: int = 5
    options: SpeculationOptions = attrs.field(factory=SpeculationOptions)
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    compare: list[str] = attrs.field(factory=list)
    compare_reps: int | None = None  # None: reps
    governor_check: bool = False
    governor_reps: int = 3
    command: str = "tsspec bench"


def serving_algorithms(catalog, target, options: SpeculationOptions) -> tuple[list[str], dict[str, str]]:
    """(names that serve ``target``, {name: decline reason} for those that do not)."""
    serving, declined = [], {}
    for row in catalog.speculators.evaluate(target, options):
        if row["status"] == "serves":
            serving.append(row["name"])
        else:
            declined[row["name"]] = f"{row['code']}: {row['reason']}"
    return serving, declined


def choose_algorithms(requested: Sequence[str] | None, serving: Sequence[str], declined: dict[str, str]) -> list[str]:
    """The algorithms to benchmark; an explicitly requested one that cannot serve is an error."""
    if requested is None:
        return list(serving)
    out = []
    for name in requested:
        if name in serving:
            out.append(name)
        elif name in declined:
            raise OptionsError(f"--spec-type {name} cannot serve this model: {declined[name]}")
        else:
            known = ", ".join([*serving, *declined]) or "none"
            raise OptionsError(f"--spec-type {name}: no such algorithm is registered (registered: {known})")
    return out


def build_configs(algorithms: Sequence[str], oracle: Sequence[float], oracle_classes,
                  oracle_governor: Sequence[bool | None] = (None,)) -> list[BenchConfig]:
    configs = [BenchConfig.plain()]
    configs += [BenchConfig.for_algorithm(a) for a in algorithms]
    configs += [BenchConfig.oracle(p, adaptive=g, classes=oracle_classes) for g in oracle_governor for p in oracle]
    return configs


def _now() -> str:
    return _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


def run_plan(
    plan: BenchPlan,
    target,
    *,
    catalog=None,
    progress: Callable[[str, int, int, str], None] | None = None,
    on_mismatch: Callable | None = None,
    on_peer_error: Callable[[str, str], None] | None = None,
) -> BenchReport:
    """Run everything the plan asks for on ``target`` and return the report.

    ``progress(phase, done, total, text)`` is called after every run (and once with done=0
    when a phase starts)."""
    started, t0, load_start = _now(), time.perf_counter(), load_average()
    report_progress = progress or (lambda phase, done, total, text: None)

    def counter(phase: str, total: int):
        done = [0]
        report_progress(phase, 0, total, "")

        def tick(text: str) -> None:
            done[0] += 1
            report_progress(phase, done[0], total, text)

        return tick
    declined = {}
    if plan.algorithms == []:
        algorithms = []
    else:
        if catalog is None:
            from ..runtime.defaults import default_catalog

            catalog = default_catalog()
        serving, declined = serving_algorithms(catalog, target, plan.options)
        algorithms = choose_algorithms(plan.algorithms, serving, declined)
    cases: list[EncodedCase] = [encode_case(target, c) for c in plan.cases]
    classes = list(dict.fromkeys(c.cls for c in cases))
    if plan.oracle_classes:
        missing = [c for c in plan.oracle_classes if c not in classes]
        if missing:
            raise OptionsError(f"--oracle-classes: no prompt of class {missing[0]!r} in this run")
    configs = build_configs(algorithms, plan.oracle_acceptance, plan.oracle_classes, plan.oracle_governor)
    runner = BenchRunner(
        target, cases, configs, reps=plan.reps, options=plan.options, sampling=plan.sampling,
        registry=None if catalog is None else catalog.speculators, on_mismatch=on_mismatch,
    )
    records = []
    if len(configs) > 1:
        tick = counter("tsspec", len(runner.slots()))
        runner.on_run = lambda slot, rec: tick(f"{rec.case_id} {rec.config}: {rec.tokens_per_second:.1f} tok/s")
        records = runner.run()
    rows = summarise(records, [c.name for c in configs], classes)

    peer_records, peer_rows, peer_errors = [], [], {}
    if plan.compare:
        from .peers import PeerUnavailable, common_prefix, make_peer, run_peer, summarise_peers

        stop = sorted(getattr(getattr(target, "tokenizer", None), "eos_token_ids", ()) or ())
        references = dict(runner.references)
        for name in plan.compare:
            try:
                if plan.model_path is None:
                    raise PeerUnavailable("peers need a GGUF model file, not the toy")
                report_progress(name, 0, 0, f"loading {Path(plan.model_path).name}")
                peer = make_peer(name, plan.model_path, stop)
            except PeerUnavailable as exc:
                peer_errors[name] = str(exc)
                if on_peer_error is not None:
                    on_peer_error(name, str(exc))
                continue
            reps = plan.compare_reps or plan.reps
            tick = counter(name, 2 * (1 + len(cases) * reps))
            try:
                peer_records += run_peer(
                    peer, cases, reps, on_run=lambda r: tick(f"{r.case_id} {r.config}: {r.tokens_per_second:.1f} tok/s"),
                )
            finally:
                peer.close()
        for record in peer_records:
            reference = references.get(record.case_id)
            if reference is not None:
                record.tsspec_prefix = common_prefix(record.tokens, reference)
        peer_rows = summarise_peers(peer_records, classes, references)

    governor = []
    if plan.governor_check:
        from .governor_check import CONFIG_COUNT, DEFAULT_CASES, VIRTUAL, WALL, run_governor_check

        for clock in (VIRTUAL, WALL):
            tick = counter(f"governor/{clock}", CONFIG_COUNT * (1 + DEFAULT_CASES * plan.governor_reps))
            governor.append(run_governor_check(
                reps=plan.governor_reps, window=plan.options.window(), clock=clock,
                on_run=lambda slot, rec: tick(f"{rec.case_id} {rec.config}: {rec.tokens_per_second:.1f} tok/s"),
            ))

    cfg = target.config
    meta = {
        "tsspec_version": __version__,
        "command": plan.command,
        "run_by": RUN_BY_MAKE if os.environ.get("MAKELEVEL") else None,
        "started": started,
        "finished": _now(),
        "duration_s": round(time.perf_counter() - t0, 1),
        "load_start": load_start,
        "load_end": load_average(),
        "machine": describe_machine(),
        "model": {
            "name": plan.model_name,
            "path": plan.model_path,
            "architecture": cfg.architecture,
            "vocab_size": cfg.vocab_size,
            "context": target.max_context_length,
        },
        "settings": {
            "reps": plan.reps,
            "compare_reps": plan.compare_reps or plan.reps,
            "prompts": plan.prompts_label,
            "sampling": _sampling_text(plan.sampling),
            "window": draft_window(plan.options, target),
            "adaptive": plan.options.adaptive,
            "algorithms": algorithms,
            "declined": declined,
            "oracle_acceptance": plan.oracle_acceptance,
            "oracle_classes": plan.oracle_classes,
            "oracle_governed": {c.name: plan.options.adaptive if c.adaptive is None else c.adaptive
                                for c in configs if c.kind == "oracle"},
            "compare": plan.compare,
        },
    }
    case_info = [
        {"id": c.id, "class": c.cls, "prompt_tokens": len(c.prompt_ids), "max_tokens": c.max_tokens, "trimmed": c.trimmed}
        for c in cases
    ]
    return BenchReport(meta, case_info, records, rows, classes, peer_records, peer_rows, peer_errors, governor)


def _sampling_text(s: SamplingParams) -> str:
    if s.greedy:
        return "greedy" + (f", repeat penalty {s.repeat_penalty}" if s.repeat_penalty != 1.0 else "")
    return (f"temperature {s.temperature}, top-k {s.top_k}, top-p {s.top_p}, min-p {s.min_p}, "
            f"repeat penalty {s.repeat_penalty}, seed {s.seed}")


def model_label(path: str | None) -> str:
    return "toy" if path is None or str(path).startswith("toy") else Path(str(path)).name
