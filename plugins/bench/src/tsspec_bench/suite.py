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

from tsspec import __version__
from tsspec.errors import OptionsError, TsspecError
from tsspec.cost_shape import parse_cost_shape
from tsspec.runtime.generation import draft_window
from tsspec.runtime.loading import LoadOptions
from tsspec.runtime.registry import AUTO
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from .machine import describe_machine, load_average
from .prompts import EncodedCase, PromptCase, encode_case
from .report import BenchReport
from .runner import BenchConfig, BenchRunner
from .drafters import HeadSwitch, bundled_heads
from .summary import summarise

RUN_BY_MAKE = "make bench"  # the Makefile target that regenerates BENCHMARKS.md


@attrs.define
class BenchPlan:
    """What to measure."""

    model_name: str
    model_path: str | None  # the GGUF (peers load it); None for the toy
    cases: list[PromptCase]
    prompts_label: str  # "the shipped set (tsspec_bench/data/prompts/bench.jsonl)" or the user's file
    algorithms: list[str] | None = None  # None: every algorithm that serves the model
    oracle_acceptance: list[float] = attrs.field(factory=list)
    oracle_classes: list[str] | None = None
    oracle_governor: tuple[bool | None, ...] = (None,)  # governor settings of the sweep (None: options')
    oracle_draft: list[int] = attrs.field(factory=list)  # the sweep again with drafts capped at each N (governor off)
    reps: int = 5
    options: SpeculationOptions = attrs.field(factory=SpeculationOptions)
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    compare: list[str] = attrs.field(factory=list)
    compare_reps: int | None = None  # None: reps
    peer_reps: dict[str, int] = attrs.field(factory=dict)  # per-engine paired reps (over compare_reps)
    governor_check: bool = False
    goals: bool = False  # the CPU speed goals: verify cost by rows, prefill, ratios to llama.cpp
    goals_dtype: str | None = None  # --dtype of the plain row beside goal 2 (None: precision.SECOND_DTYPE)
    governor_reps: int = 3
    command: str = "tsspec bench"
    device: str = "cpu"  # what the target was loaded with (bundled drafters attach alike)
    dtype: str | None = None


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
    """The algorithms to benchmark; an explicitly requested one that cannot serve is an error.
    By default every serving algorithm, then ``auto`` (what the runtime picks by itself) when
    any serves."""
    if requested is None:
        return [*serving, AUTO] if serving else []
    out = []
    for name in requested:
        if name == AUTO or name in serving:
            out.append(name)
        elif name in declined:
            raise OptionsError(f"--spec-type {name} cannot serve this model: {declined[name]}")
        else:
            known = ", ".join([*serving, *declined]) or "none"
            raise OptionsError(f"--spec-type {name}: no such algorithm is registered (registered: {known})")
    return out


def build_configs(algorithms: Sequence[str], oracle: Sequence[float], oracle_classes,
                  oracle_governor: Sequence[bool | None] = (None,), oracle_draft: Sequence[int] = (),
                  *, control: bool = False) -> list[BenchConfig]:
    """Plain first, then the algorithms, the oracle sweep at the draft window, the sweep
    again at each draft cap of ``oracle_draft`` with the governor off (it would shorten the
    drafts by its own measurements: off, every step drafts the cap), and last the control
    (plain again) when anything else runs or ``control`` asks for it (peers to judge)."""
    configs = [BenchConfig.plain()]
    configs += [BenchConfig.for_algorithm(a) for a in algorithms]
    configs += [BenchConfig.oracle(p, adaptive=g, classes=oracle_classes) for g in oracle_governor for p in oracle]
    configs += [BenchConfig.oracle(p, adaptive=False, classes=oracle_classes, max_draft=n)
                for n in oracle_draft for p in oracle]
    if len(configs) > 1 or control:
        configs.append(BenchConfig.control())
    return configs


def check_oracle_draft(oracle_draft: Sequence[int], oracle: Sequence[float], window: int) -> None:
    """``--oracle-draft`` caps must be shorter than the draft window, with P values to run."""
    if not oracle_draft:
        return
    if not oracle:
        raise OptionsError("--oracle-draft needs --oracle-acceptance (the P values the capped sweep runs)")
    for n in oracle_draft:
        if not 1 <= n < window:
            raise OptionsError(f"--oracle-draft {n}: choose 1..{window - 1} (the draft window is {window}; "
                               "the sweep at the window runs anyway)")


def verify_row_profile(target) -> list[list[float]] | None:
    """The target's measured forward cost by rows (``spec_verify_row_ms``, what the runtime
    prices drafts by) as [[rows, ms], ..], or None when it publishes none."""
    try:
        from tsspec.capabilities import verify_cost_shape

        shape = parse_cost_shape(verify_cost_shape(target))
    except Exception:  # a target's optional attribute: anything it raises means no profile
        return None
    return None if shape is None else [[r, ms] for r, ms in shape]


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
    heads = None
    if plan.algorithms == []:
        algorithms = []
    else:
        if catalog is None:
            from tsspec.runtime.defaults import default_catalog

            catalog = default_catalog()
        heads = HeadSwitch(target, bundled_heads(
            catalog, target, plan.model_path, LoadOptions(device=plan.device, dtype=plan.dtype, speculation=plan.options),
            operator_drafter=bool(plan.options.drafter_path),
        ))
        serving, declined = serving_algorithms(catalog, target, plan.options)
        for name in heads.heads:  # an algorithm that serves with the drafter shipped for it
            if name != AUTO and name not in serving:
                heads.use(name)
                with_head, _ = serving_algorithms(catalog, target, plan.options)
                if name in with_head:
                    serving.append(name)
                    declined.pop(name, None)
        heads.restore()
        algorithms = choose_algorithms(plan.algorithms, serving, declined)
    cases: list[EncodedCase] = [encode_case(target, c) for c in plan.cases]
    classes = list(dict.fromkeys(c.cls for c in cases))
    if plan.oracle_classes:
        missing = [c for c in plan.oracle_classes if c not in classes]
        if missing:
            raise OptionsError(f"--oracle-classes: no prompt of class {missing[0]!r} in this run")
    window = draft_window(plan.options, target)
    check_oracle_draft(plan.oracle_draft, plan.oracle_acceptance, window)
    configs = build_configs(algorithms, plan.oracle_acceptance, plan.oracle_classes, plan.oracle_governor,
                            plan.oracle_draft, control=bool(plan.compare))
    runner = BenchRunner(
        target, cases, configs, reps=plan.reps, options=plan.options, sampling=plan.sampling,
        registry=None if catalog is None else catalog.speculators, on_mismatch=on_mismatch, heads=heads,
    )
    references = runner.references
    footprint = None
    if plan.goals:  # the weights' bytes before the drafters' runs (see physics.weight_footprint)
        from .physics import weight_footprint

        footprint = weight_footprint(target)
    peers, peer_errors = _start_peers(plan, target, cases, report_progress, on_peer_error)
    second, second_runs = _second_target(plan, target, catalog, peers, report_progress), []
    peer_records: list = []
    # the peers run after tsspec's whole round of a prompt (never between tsspec's paired runs),
    # plain and prompt lookup in the round's order; prompt lookup pairs with tsspec's first
    # algorithm (ngram when installed) of the same prompt and round
    partner = next((c.name for c in configs if c.kind == "algorithm"), None)
    compare_reps = plan.compare_reps or plan.reps
    reps_of = {name: min(plan.peer_reps.get(name, compare_reps), plan.reps) for name in peers}
    peer_tick = counter("peers", sum(2 * (1 + len(cases) * n) for n in reps_of.values())) if peers else None

    def run_peers(kinds, case, rep, tsspec_record=None) -> list:
        from .peers import PeerUnavailable, run_peer_once

        start = len(peer_records)
        for name, peer in list(peers.items()):
            if rep >= reps_of[name]:
                continue
            for kind in kinds:
                try:
                    rec = run_peer_once(peer, kind, case, rep,
                                        tsspec_tps=None if tsspec_record is None else tsspec_record.tokens_per_second,
                                        tsspec_config=None if tsspec_record is None else tsspec_record.config)
                except PeerUnavailable as exc:
                    peer_errors[name] = str(exc)
                    peers.pop(name).close()
                    break
                peer_records.append(rec)
                peer_tick(f"{name} {rec.case_id} {rec.config}: {rec.tokens_per_second:.1f} tok/s")
        return peer_records[start:]

    def run_second(case, rep, after: list) -> None:
        """The second-arithmetic target's plain run, right after llama.cpp's plain run."""
        from .precision import PrecisionRun

        llama = next((r for r in after if r.engine == "llama.cpp" and r.config == "plain"), None)
        if second is None or llama is None:
            return
        result = second.runner.run_one(BenchConfig.plain(), case)
        second_runs.append(PrecisionRun(case.id, case.cls, rep, list(result.tokens), result.stats.tokens_per_second,
                                        llama.tokens, llama.tokens_per_second, llama.variant,
                                        references.get(case.id)))
        report_progress(f"{second.dtype} plain", len(second_runs), 0,
                        f"{case.id}: {result.stats.tokens_per_second:.1f} tok/s")

    records, row_cost = [], None
    try:
        if len(configs) > 1 or peers:
            slots = runner.slots()
            tick = counter("tsspec", len(slots))
            round_ends = {(s.case, s.rep): i for i, s in enumerate(slots)}  # each round's last slot
            in_round: dict[str, object] = {}  # config name -> this round's record

            def on_run(slot, rec) -> None:
                tick(f"{rec.case_id} {rec.config}: {rec.tokens_per_second:.1f} tok/s")
                in_round[rec.config] = rec
                if round_ends[(slot.case, slot.rep)] != rec.order:
                    return
                case, plain, mine = cases[slot.case], in_round.get("plain"), in_round.get(partner)
                in_round.clear()
                kinds = ("plain", "prompt-lookup") if slot.rep % 2 == 0 else ("prompt-lookup", "plain")
                after = []
                for kind in kinds:
                    after += run_peers((kind,), case, slot.rep, plain if kind == "plain" or mine is None else mine)
                run_second(case, slot.rep, after)

            runner.on_run = on_run
            records = runner.run()
            if heads is not None:
                heads.restore()
            row_cost = _row_cost(target, cases, window, report_progress)
        rows = summarise(records, [c.name for c in configs], classes)
        peer_rows = []
        if plan.compare:
            from .peers import common_prefix, summarise_peers

            for record in peer_records:
                reference = references.get(record.case_id)
                if reference is not None:
                    record.tsspec_prefix = common_prefix(record.tokens, reference)
            peer_rows = summarise_peers(peer_records, classes, references)
        goals = None
        if plan.goals:
            from .goals import measure_goals

            goals = measure_goals(target, cases, peers, progress=report_progress, model_path=plan.model_path,
                                  footprint=footprint,
                                  second=None if second is None else (second.runner.target, second.dtype,
                                                                      second.arithmetic))
            if second is not None:
                from .precision import summarise as summarise_precision

                goals["second_precision"] = summarise_precision(second_runs, second.dtype, second.arithmetic)
    finally:
        if heads is not None:
            heads.restore()
        peer_info = {name: peer.describe() for name, peer in peers.items()}
        for peer in peers.values():
            peer.close()

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
        # the verify cost by rows measured again after the runs (row_cost.measure_row_costs)
        "row_cost": row_cost,
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
            "peer_reps": {name: min(plan.peer_reps.get(name, plan.compare_reps or plan.reps), plan.reps)
                          for name in plan.compare},
            "prompts": plan.prompts_label,
            "sampling": _sampling_text(plan.sampling),
            "window": window,
            "adaptive": plan.options.adaptive,
            "algorithms": algorithms,
            "declined": declined,
            "oracle_acceptance": plan.oracle_acceptance,
            "oracle_classes": plan.oracle_classes,
            "oracle_governed": {c.name: plan.options.adaptive if c.adaptive is None else c.adaptive
                                for c in configs if c.kind == "oracle"},
            "oracle_draft": list(plan.oracle_draft),
            # each oracle configuration's draft length: its cap, else the window
            "oracle_draft_lengths": {c.name: c.max_draft or window for c in configs if c.kind == "oracle"},
            # the target's forward cost by rows as measured on this machine ([rows, ms]; None: not published)
            "verify_row_ms": verify_row_profile(target),
            "compare": plan.compare,
            "peers": peer_info,
        },
    }
    case_info = [
        {"id": c.id, "class": c.cls, "prompt_tokens": len(c.prompt_ids), "max_tokens": c.max_tokens, "trimmed": c.trimmed}
        for c in cases
    ]
    return BenchReport(meta, case_info, records, rows, classes, peer_records, peer_rows, peer_errors, governor, goals)


def _row_cost(target, cases, window: int, report_progress) -> dict | None:
    """The target's verify cost by rows up to the window's width, measured now on the run's own
    prompt tokens (None where the target cannot be measured so)."""
    from .goals import token_stream
    from .row_cost import bench_context, measure_row_costs

    if not cases:
        return None
    context = bench_context(cases)
    report_progress("verify cost by rows", 0, 0, f"1..{window + 1} rows after {context} tokens")
    try:
        return measure_row_costs(target, token_stream(cases, context + window + 1), range(2, window + 2),
                                 context=context)
    except Exception as exc:  # any failure: the section then reads the loop's steps or the target's profile
        report_progress("verify cost by rows", 0, 0, f"not measured: {exc}")
        return None


@attrs.frozen
class SecondTarget:
    """The model loaded again in a second arithmetic, for the plain row beside goal 2."""

    runner: BenchRunner  # plain runs on the second target
    dtype: str  # its --dtype
    arithmetic: str | None  # what its loader reports (config.extra["arithmetic"])


def _second_target(plan: BenchPlan, target, catalog, peers: dict, report_progress) -> SecondTarget | None:
    """The model in ``plan.goals_dtype`` (default precision.SECOND_DTYPE) for the plain row
    beside goal 2, or None (no --goals, no llama.cpp peer, no model file, a load error, or the
    bench's target already runs that arithmetic)."""
    from .precision import SECOND_DTYPE

    dtype = plan.goals_dtype or SECOND_DTYPE
    if not plan.goals or "llama.cpp" not in peers or plan.model_path is None or dtype == plan.dtype:
        return None
    from tsspec.runtime.loading import load_model

    report_progress(f"{dtype} plain", 0, 0, f"loading {Path(plan.model_path).name} with --dtype {dtype}")
    try:
        other = load_model(plan.model_path, device=plan.device, dtype=dtype, options=plan.options, catalog=catalog)
    except TsspecError as exc:  # the extra row is not measured; the bench goes on
        report_progress(f"{dtype} plain", 0, 0, f"not measured: {exc}")
        return None
    arithmetic = (getattr(other.config, "extra", None) or {}).get("arithmetic")
    if arithmetic is not None and arithmetic == (getattr(target.config, "extra", None) or {}).get("arithmetic"):
        return None
    runner = BenchRunner(other, [], [BenchConfig.plain()], reps=1, options=plan.options, sampling=plan.sampling)
    return SecondTarget(runner, dtype, arithmetic)


def _start_peers(plan: BenchPlan, target, cases, report_progress, on_peer_error) -> tuple[dict, dict]:
    """The requested peers, each in its own process and tuned to its fastest variant on the
    first prompt: ({name: PeerProcess}, {name: why it is not measured})."""
    from .peers import PeerUnavailable, make_peer

    peers, errors = {}, {}
    stop = sorted(getattr(getattr(target, "tokenizer", None), "eos_token_ids", ()) or ())
    for name in plan.compare:
        try:
            if plan.model_path is None:
                raise PeerUnavailable("peers need a GGUF model file, not the toy")
            report_progress(name, 0, 0, f"loading {Path(plan.model_path).name} in its own process")
            peer = make_peer(name, plan.model_path, stop)
            try:
                if cases:
                    report_progress(name, 0, 0, "probing its variants")
                    # prompt lookup is probed where goal 3 compares it: an input-grounded prompt
                    from .goals import GROUNDED

                    grounded = next((c for c in cases if c.cls in GROUNDED), cases[0])
                    peer.tune(cases[0].prompt_ids, lookup_prompt_ids=grounded.prompt_ids)
            except PeerUnavailable:
                peer.close()
                raise
        except PeerUnavailable as exc:
            errors[name] = str(exc)
            if on_peer_error is not None:
                on_peer_error(name, str(exc))
            continue
        peers[name] = peer
    return peers, errors


def _sampling_text(s: SamplingParams) -> str:
    if s.greedy:
        return "greedy" + (f", repeat penalty {s.repeat_penalty}" if s.repeat_penalty != 1.0 else "")
    return (f"temperature {s.temperature}, top-k {s.top_k}, top-p {s.top_p}, min-p {s.min_p}, "
            f"repeat penalty {s.repeat_penalty}, seed {s.seed}")


def model_label(path: str | None) -> str:
    return "toy" if path is None or str(path).startswith("toy") else Path(str(path)).name
