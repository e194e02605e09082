"""The benchmark's outputs: a rich table, JSON, and the Markdown of BENCHMARKS.md.

Everything printed is computed from the records of one run; the Markdown's "reading" is written
from the same figures (which classes win, which lose, the break-even acceptance, the peers'
ratios), so regenerating the document can never leave stale prose behind.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Sequence

import attrs

from tsspec_gguf.row_timing import monotone
from tsspec.runtime.registry import AUTO
from .lossless import MISMATCH, TIE
from .machine import machine_line
from .peers import BEST, LOOKUP, PeerRecord, PeerRow
from .runner import ALGORITHM, CONTROL, ORACLE, PLAIN, RunRecord
from .needs import (MIN_VERIFIED, DrafterMeasure, DrafterNeeds, drafter_needs, relative_costs, rounded_length,
                    shape_from_steps)
from .summary import ALL_CLASSES, MIN_BAND_PAIRS, NoiseBand, SummaryRow, control_band

SHOWN_POSITIONS = 8  # accepted-per-position columns shown in tables


@attrs.define
class BenchReport:
    meta: dict
    cases: list[dict]
    records: list[RunRecord]
    rows: list[SummaryRow]
    classes: list[str]
    peer_records: list[PeerRecord] = attrs.field(factory=list)
    peer_rows: list[PeerRow] = attrs.field(factory=list)
    peer_errors: dict[str, str] = attrs.field(factory=dict)
    governor: list = attrs.field(factory=list)  # GovernorCheck per clock (virtual, wall)
    goals: dict | None = None  # the CPU speed goals' in-process measurements (goals.measure_goals)

    def goal_rows(self) -> list:
        from .goals import goal_rows

        return goal_rows(self) if (self.goals or self.peer_records) else []

    # -- selections ------------------------------------------------------------------------
    @property
    def band(self) -> NoiseBand | None:
        """The control row's spread: the ratios noise alone gives a pair (None: no control)."""
        return control_band(self.rows)

    def rows_of(self, kind: str, cls: str | None = None) -> list[SummaryRow]:
        return [r for r in self.rows if r.kind == kind and (cls is None or r.cls == cls)]

    def algorithms(self) -> list[str]:
        return list(dict.fromkeys(r.config for r in self.rows if r.kind == ALGORITHM))

    def oracle_rows(self, governor: bool | None = None, draft: int | None = None) -> list[SummaryRow]:
        """The sweep's 'all' rows by acceptance; ``governor`` picks one setting (None: all);
        ``draft`` the sweep whose drafts are capped at that many tokens (None: the sweep at the
        draft window)."""
        length = self.meta["settings"]["window"] if draft is None else draft
        rows = [r for r in self.rows_of(ORACLE, ALL_CLASSES)
                if (governor is None or self.oracle_governed(r) == governor) and self.oracle_draft_length(r) == length]
        return sorted(rows, key=lambda r: (r.acceptance_target, r.config))

    def oracle_governed(self, row: SummaryRow | RunRecord) -> bool:
        return bool(self.meta["settings"].get("oracle_governed", {}).get(row.config, self.meta["settings"]["adaptive"]))

    def oracle_draft_length(self, row: SummaryRow | RunRecord) -> int:
        """The most tokens the oracle of ``row`` drafted a step: its cap, else the window."""
        settings = self.meta["settings"]
        return int(settings.get("oracle_draft_lengths", {}).get(row.config, settings["window"]))

    def capped_lengths(self) -> list[int]:
        """The draft caps the sweep also ran at (``--oracle-draft``), shortest first."""
        window = self.meta["settings"]["window"]
        return sorted({self.oracle_draft_length(r) for r in self.rows_of(ORACLE, ALL_CLASSES)} - {window})

    def sweep_rows(self, draft: int | None = None) -> list[SummaryRow]:
        """The rows that show the mechanics (at the window, or capped at ``draft``): governor
        off when measured, else what there is."""
        off = self.oracle_rows(governor=False, draft=draft)
        return off or self.oracle_rows(draft=draft)

    @property
    def mismatches(self) -> list[RunRecord]:
        return [r for r in self.records if r.verdict is not None and r.verdict.status == MISMATCH]

    def lossless_totals(self) -> dict:
        checked = [r for r in self.records if r.kind not in (PLAIN, CONTROL) and r.verdict is not None]
        ties = [r for r in checked if r.verdict.status == TIE]
        return {
            "speculative_runs": len(checked),
            "identical": sum(r.verdict.status == "identical" for r in checked),
            "ties": len(ties),
            "mismatches": len(self.mismatches),
            "identical_rate": round(sum(r.verdict.status == "identical" for r in checked) / len(checked), 4) if checked else None,
            "details": [
                {"case": r.case_id, "config": r.config, "rep": r.rep, **r.verdict.to_json()}
                for r in [*ties, *self.mismatches]
            ],
        }

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "meta": self.meta,
            "cases": self.cases,
            "summary": [r.to_json() for r in self.rows],
            "control_band": None if self.band is None else self.band.to_json(),
            "lossless": self.lossless_totals(),
            "peers": {
                "summary": [r.to_json() for r in self.peer_rows],
                "errors": self.peer_errors,
                "runs": [r.to_json() for r in self.peer_records],
            },
            "governor_check": [g.to_json() for g in self.governor],
            "goals": {"measured": self.goals, "rows": [g.to_json() for g in self.goal_rows()]},
            "drafter_needs": drafter_needs_of(self).to_json(),
            "runs": [r.to_json() for r in self.records],
        }

    def write_json(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    # -- terminal --------------------------------------------------------------------------
    def print_tables(self, console) -> None:
        from rich.table import Table

        table = Table(title=f"tsspec bench: {self.meta['model']['name']}, {self.meta['settings']['reps']} paired reps",
                      caption=machine_line(self.meta["machine"]), show_lines=False)
        for col, justify in (("class", "left"), ("config", "left"), ("plain tok/s", "right"), ("tok/s", "right"),
                             ("speed-up (min-max)", "right"), ("accept", "right"), ("tok/verify", "right"),
                             ("ms draft/verify/rollback/plain", "right"), ("governor w/l/parked", "right"),
                             ("lossless", "right")):
            table.add_column(col, justify=justify)
        for row in self.rows:
            if row.kind == PLAIN:
                continue
            table.add_row(
                row.cls, row.config, f"{row.plain_tokens_per_second:.1f}", f"{row.tokens_per_second:.1f}",
                _ratio_text(row), f"{row.acceptance_rate:.2f}", f"{row.tokens_per_verify:.2f}",
                "/".join(f"{row.phase_ms.get(p, 0.0):.0f}" for p in ("draft", "verify", "rollback", "plain")),
                f"{row.governor_wins}/{row.governor_losses}/{row.governor_parked_steps}",
                _lossless_text(row),
                style="bold" if row.cls == ALL_CLASSES else None,
            )
        console.print(table)
        band = self.band
        console.print("control (plain vs plain): " + (f"{band.text()}; a median speed-up inside it is no difference"
                                                       if band is not None else "not run: no win or loss is claimed"))
        if self.peer_rows:
            peers = Table(title="peers on the same GGUF and prompt ids")
            for col in ("engine", "config", "class", "tok/s", "speed-up vs own plain", "tsspec / this (paired)",
                        "same as own plain", "same as tsspec plain"):
                peers.add_column(col)
            for row in self.peer_rows:
                if row.cls != ALL_CLASSES:
                    continue
                peers.add_row(row.engine, row.config, row.cls, f"{row.tokens_per_second:.1f}", _ratio_text(row),
                              f"{row.tsspec_over_this:.2f}x" if row.tsspec_over_this else "-",
                              f"{row.same_as_own_plain}/{row.runs}", f"{row.same_as_tsspec_plain}/{row.runs}")
            console.print(peers)
        goal_rows = self.goal_rows()
        if goal_rows:
            goals = Table(title="CPU speed goals, paired ratios")
            for col in ("#", "goal", "measured", "ratio", "target", "verdict"):
                goals.add_column(col)
            for g in goal_rows:
                goals.add_row(str(g.number), g.name, g.figure, "-" if g.ratio is None else f"{g.ratio:.2f}x", g.goal,
                              "-" if g.met is None else ("met" if g.met else "NOT met"))
            console.print(goals)
        for name, error in self.peer_errors.items():
            console.print(f"[yellow]peer {name} skipped: {error}[/yellow]")
        for check in self.governor:
            gov = Table(title=f"cost governor, {check.settings['clock']} clock "
                              "(toy with the embedded model's verify-cost profile)")
            for col in ("figure", "tok/s", "reference tok/s", "ratio (min-max)", "goal", "verdict"):
                gov.add_column(col)
            for f in check.figures:
                verdict = "-" if f.passed is None else ("pass" if f.passed else "MISS")
                gov.add_row(f.name, f"{f.tokens_per_second:.1f}", f"{f.reference_tokens_per_second:.1f}",
                            f"{f.ratio_median:.3f} ({f.ratio_min:.2f}-{f.ratio_max:.2f})",
                            "-" if f.goal is None else f">= {f.goal}", verdict)
            console.print(gov)
        totals = self.lossless_totals()
        style = "red bold" if totals["mismatches"] else "green"
        console.print(
            f"[{style}]lossless: {totals['identical']} identical, {totals['ties']} float ties, "
            f"{totals['mismatches']} mismatches in {totals['speculative_runs']} speculative runs[/{style}]"
        )

    # -- Markdown --------------------------------------------------------------------------
    def to_markdown(self, plot_path: str | None = None) -> str:
        return "\n".join(_markdown(self, plot_path)) + "\n"

    def write_markdown(self, path: str | Path, plot_path: str | Path | None = None) -> None:
        p = Path(path)
        rel = None
        if plot_path is not None:
            try:
                rel = str(Path(plot_path).resolve().relative_to(p.resolve().parent))
            except ValueError:
                rel = str(Path(plot_path).resolve())
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.to_markdown(rel), encoding="utf-8")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ratio_text(row) -> str:
    if row.ratio_median is None:
        return "-"
    return f"{row.ratio_median:.2f}x ({row.ratio_min:.2f}-{row.ratio_max:.2f})"


def _lossless_text(row: SummaryRow) -> str:
    text = f"{row.identical}/{row.runs}"
    if row.ties:
        text += f" +{row.ties} tie"
    if row.mismatches:
        text += f" {row.mismatches} MISMATCH"
    return text


def _verdict_word(ratio: float, band: NoiseBand | None) -> str:
    """'wins' / 'loses' / 'is within noise' against the control row's spread, 'is unjudged'
    without one."""
    if band is None:
        return "is unjudged (no control row)"
    verdict = band.verdict(ratio)
    if verdict == "unjudged":
        return f"is unjudged (the control row has {band.pairs} pair{'s' if band.pairs != 1 else ''}: too few for a spread)"
    return verdict if verdict != "within noise" else "is within noise"


def break_even_acceptance(rows: Sequence[SummaryRow]) -> float | None:
    """The oracle per-token acceptance where the median speed-up crosses 1.0 (linear
    interpolation between sweep points), or None when it never crosses."""
    points = [(r.acceptance_target, r.ratio_median) for r in rows if r.ratio_median is not None]
    points.sort()
    for (p0, r0), (p1, r1) in zip(points, points[1:]):
        if r0 < 1.0 <= r1 and r1 != r0:
            return p0 + (1.0 - r0) * (p1 - p0) / (r1 - r0)
    return None


def sweep_ratio_at(rows: Sequence[SummaryRow], p: float) -> float | None:
    """The sweep's median speed-up at acceptance ``p`` (linear between its points; None
    outside them)."""
    points = sorted((r.acceptance_target, r.ratio_median) for r in rows if r.ratio_median is not None)
    for (p0, r0), (p1, r1) in zip(points, points[1:]):
        if p0 <= p <= p1:
            return r0 if p1 == p0 else r0 + (p - p0) * (r1 - r0) / (p1 - p0)
    return None


@attrs.frozen
class Placement:
    """One measured algorithm on the sweep's P axis."""

    name: str
    p: float  # the share of its drafts whose first token landed (all classes)
    drafted_per_verify: float  # its mean drafted tokens per verify
    sweep_length: int  # the draft length of the sweep it is read off
    at: float | None  # that sweep's speed-up at P
    own: float | None  # the algorithm's own median speed-up


def sweep_length_for(drafted_per_verify: float, lengths: Sequence[int]) -> int:
    """The sweep to read a drafter off: the one whose draft length is its mean draft length
    rounded, else the nearest (the shorter on a tie).

    >>> sweep_length_for(1.2, [2, 8]), sweep_length_for(5.0, [2, 8]), sweep_length_for(1.6, [1, 2, 8])
    (2, 2, 2)
    """
    want = rounded_length(drafted_per_verify)
    return min(lengths, key=lambda n: (abs(n - want), n))


def placements(report: "BenchReport") -> list[Placement]:
    """Each measured algorithm on the P axis of the sweep whose draft length matches how it
    drafts (its mean drafted tokens per verify, rounded; the nearest sweep that ran)."""
    window = report.meta["settings"]["window"]
    lengths = [*report.capped_lengths(), window]
    out = []
    for row in report.rows_of(ALGORITHM, ALL_CLASSES):
        if not row.accepted_per_position or not row.verify_steps:
            continue
        p = float(row.accepted_per_position[0])
        drafted = row.draft_tokens / row.verify_steps
        length = sweep_length_for(drafted, lengths)
        sweep = report.sweep_rows(None if length == window else length)
        out.append(Placement(row.config, p, drafted, length, sweep_ratio_at(sweep, p), row.ratio_median))
    return out


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _markdown(report: BenchReport, plot_path: str | None) -> list[str]:
    meta, settings, model = report.meta, report.meta["settings"], report.meta["model"]
    m = meta["machine"]
    lines = [
        "# tsspec benchmarks",
        "",
        f"Generated by `{meta['command']}`{_via(meta)} on {meta['finished']}, "
        f"in {meta['duration_s'] / 60:.1f} minutes. Do not edit by hand: rerun the command.",
        "",
        "Every speculative figure is a **ratio of paired runs**: after one warm-up round, each prompt runs "
        f"{settings['reps']} rounds of every configuration back to back in one process, in list order in even "
        "rounds and reversed in odd ones, and each run is divided by the plain run of its own round. The "
        "control row is plain decoding run again in the same schedule: its ratios are what noise alone does "
        f"to a pair, and a speed-up is called a win or a loss only outside their spread, over at least "
        f"{MIN_BAND_PAIRS} pairs"
        + (f" ({report.band.text()} in this run{'' if report.band.judges else ': too few, nothing is called'}). "
           if report.band is not None else ". ") +
        "tok/s counts decoding only (emitted tokens after the first, over the time after prefill). "
        "Each run starts as a fresh `tsspec generate` would: a park that a learned drafter's cost governor "
        "carries from one request to the next on a server is dropped between runs.",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu']} ({', '.join(m['cpu_flags']) or 'no SIMD flags read'}); "
        f"{m['usable_cpus']} usable of {m['logical_cpus']} logical CPUs; {m['memory_gib']} GiB",
        f"- {m['os']}, Python {m['python']}, torch {m['torch']} with {m['torch_threads']} threads",
        f"- load average at start {meta.get('load_start')}, at end {meta.get('load_end')} "
        "(the machine is shared: other jobs ran during the measurement)",
        "",
        "## Settings",
        "",
        f"- model: `{model['name']}` ({model['architecture']}, vocab {model['vocab_size']}, "
        f"context {model['context']})",
        f"- prompts: {settings['prompts']} ({len(report.cases)} prompts in {len(report.classes)} classes: "
        f"{', '.join(report.classes)}); prompt tokens {_range([c['prompt_tokens'] for c in report.cases])}, "
        f"new tokens {_range([c['max_tokens'] for c in report.cases])} (fewer when the model ends its answer)",
        f"- sampling: {settings['sampling']}; draft window {settings['window']}; cost governor "
        f"{'on' if settings['adaptive'] else 'off'}",
        f"- paired reps per prompt: {settings['reps']}",
        "",
    ]
    lines += _goal_section(report)
    lines += _speed_section(report)
    lines += _mechanics_section(report)
    lines += _oracle_section(report)
    lines += _needs_section(report)
    lines += _peer_section(report)
    lines += _governor_section(report)
    lines += _lossless_section(report)
    if plot_path:
        lines += ["## Plot", "", f"![speed-up per prompt class and oracle sweep]({plot_path})", ""]
    lines += _reading(report)
    lines += [
        "## Component figures",
        "",
        "Figures of single components (model loaders against transformers, the per-row "
        "snapshot path of the hybrid trunk, draft-head calls per step, DFlash block cost, the "
        "n-gram index, the real-model lossless study) are measured by their own scripts and kept "
        "in the scripts/ folders of the plugins they measure.",
        "",
    ]
    return lines


def _via(meta: dict) -> str:
    return f" (run by `{meta['run_by']}`)" if meta.get("run_by") else ""


def plain_step_ms(report: BenchReport, classes: Sequence[str] | None = None) -> float | None:
    """Mean ms of a one-row plain step, from the plain configuration's runs on ``classes``."""
    runs = [r for r in report.records if r.kind == PLAIN and not r.warmup and (not classes or r.cls in classes)]
    steps = sum(r.stats.plain_steps for r in runs)
    return sum(r.stats.phase_ms.get("plain", 0.0) for r in runs) / steps if steps else None


def _range(values: Sequence[int]) -> str:
    return f"{min(values)}-{max(values)}" if values else "-"


def _speed_section(report: BenchReport) -> list[str]:
    algos = report.algorithms()
    if not algos:
        return []
    cmd = report.meta["command"]
    lines = ["## Speculation vs plain decoding, per prompt class", "", f"Command: `{cmd}`", ""]
    header = ["class", "prompt tokens", "plain tok/s"]
    for a in algos:
        header += [f"{a} tok/s", f"{a} speed-up (min-max)", f"{a} accept", f"{a} tok/verify"]
    rows = []
    for cls in [*report.classes, ALL_CLASSES]:
        cells = {r.config: r for r in report.rows if r.cls == cls}
        if not any(a in cells for a in algos):
            continue
        tokens = [c["prompt_tokens"] for c in report.cases if cls == ALL_CLASSES or c["class"] == cls]
        plain = next(iter(cells.values())).plain_tokens_per_second
        row = [f"**{cls}**" if cls == ALL_CLASSES else cls, _range(tokens), f"{plain:.1f}"]
        for a in algos:
            r = cells.get(a)
            row += ["-"] * 4 if r is None else [f"{r.tokens_per_second:.1f}", _ratio_text(r),
                                                f"{r.acceptance_rate:.2f}", f"{r.tokens_per_verify:.2f}"]
        rows.append(row)
    lines += _table(header, rows)
    lines += ["", "tok/s are medians over runs; speed-up is the median of per-pair ratios (min-max over pairs); "
              "accept = accepted / drafted tokens; tok/verify = tokens emitted per verify step.", ""]
    lines += _control_lines(report)
    ran = auto_choices(report)
    if ran:
        lines += ["`auto` is what the runtime picks by itself for this model: it ran "
                  + ", ".join(f"{name} ({n} runs)" for name, n in ran.items()) + ".", ""]
    return lines


def _control_lines(report: BenchReport) -> list[str]:
    """The control row: plain against plain, per class and over all."""
    rows = [r for r in report.rows if r.kind == CONTROL and r.ratio_median is not None]
    if not rows:
        return ["No control row ran: no speed-up here is called a win or a loss.", ""]
    cells = ", ".join(f"{r.cls} {_ratio_text(r)}" for r in rows)
    if report.band is not None and not report.band.judges:
        return [f"Control row (plain decoding against plain decoding, same schedule): {cells}. {report.band.text()} "
                f"is too few for a spread (at least {MIN_BAND_PAIRS} pairs): no speed-up here is called a win or a "
                "loss.", ""]
    return [f"Control row (plain decoding against plain decoding, same schedule): {cells}. A median speed-up "
            f"inside {report.band.text()} is no measured difference.", ""]


def auto_choices(report: "BenchReport") -> dict[str, int]:
    """{algorithm: runs} that the ``auto`` configuration resolved to."""
    counts: dict[str, int] = {}
    for r in report.records:
        if r.config == "auto" and r.kind == ALGORITHM:
            name = r.speculator or "none (declined)"
            counts[name] = counts.get(name, 0) + 1
    return counts


def _mechanics_section(report: BenchReport) -> list[str]:
    rows = [r for r in report.rows if r.kind == ALGORITHM]
    if not rows:
        return []
    lines = ["### Where the time goes", "",
             "Milliseconds per run by phase (mean), the cost governor's decisions (summed over runs; declined "
             "drafts: keyed proposals whose key's drafts did not pay, run as plain steps), and "
             "the fraction of drafts whose token k was accepted.", ""]
    header = ["class", "config", "draft", "verify", "rollback", "snapshot", "commit", "plain",
              "verify ms/step", "plain ms/step", "governor wins/losses/parked steps", "declined drafts",
              "accepted at position 1..8"]
    body = []
    for r in rows:
        ph = r.phase_ms
        body.append([
            r.cls, r.config, *(f"{ph.get(p, 0.0):.0f}" for p in ("draft", "verify", "rollback", "snapshot", "commit", "plain")),
            f"{r.verify_ms_per_step:.1f}", f"{r.plain_ms_per_step:.1f}",
            f"{r.governor_wins}/{r.governor_losses}/{r.governor_parked_steps}", str(r.declined_drafts),
            " ".join(f"{x:.2f}" for x in r.accepted_per_position[:SHOWN_POSITIONS]) or "-",
        ])
    return lines + _table(header, body) + [""]


def _oracle_section(report: BenchReport) -> list[str]:
    rows = report.oracle_rows()
    if not rows:
        return []
    classes = report.meta["settings"].get("oracle_classes") or report.classes
    lines = [
        "## Oracle sweep: the runtime's mechanics at controlled acceptance", "",
        "The testing kit's `OracleSpeculator` drafts the plain continuation and corrupts each drafted token "
        "with probability 1 - P, so P is the chance that each drafted token is right, independent of any "
        "drafter's quality. A draft of K tokens is accepted up to its first wrong token, so the measured "
        "acceptance (accepted / drafted) is lower than P.",
        "",
        f"Prompt classes: {', '.join(classes)}. Command: `{report.meta['command']}`",
        "",
    ]
    header = ["P", "governor", "accept", "tok/verify", "tok/s", "plain tok/s", "speed-up (min-max)", "verify ms/step",
              "rollback ms/run", "governor wins/losses/parked steps"]
    rows = sorted(rows, key=lambda r: (not report.oracle_governed(r), r.acceptance_target))
    lines += _table(header, [_sweep_cells(report, r) for r in rows])
    plain_ms = plain_step_ms(report, classes)
    if plain_ms:
        lines += ["", f"A one-row plain step on these prompts takes {plain_ms:.1f} ms (plain runs, same classes)."]
    be = break_even_acceptance(report.sweep_rows())
    lines += ["", f"Break-even (the sweep's mechanics{'' if report.oracle_rows(governor=False) else ', governor on'}): "
              f"speculation pays from P ~ {be:.2f} upward." if be is not None else
              "The median speed-up does not cross 1.0 inside the sweep.",
              "With the governor on, measured acceptance is biased low: it parks after drafts that get nothing "
              "accepted, so fewer of the lucky verifies happen.", ""]
    window = report.meta["settings"]["window"]
    for cap in report.capped_lengths():
        capped = report.oracle_rows(draft=cap)
        lines += [f"### The sweep with drafts capped at {cap} token{'s' if cap != 1 else ''}", "",
                  f"The same P values with the oracle drafting at most {cap} token{'s' if cap != 1 else ''} a step "
                  f"(a verify of {cap + 1} rows) and the cost governor off, so every step drafts the cap (on, the "
                  "governor would shorten drafts by what it measures): the mechanics a drafter of that length "
                  "meets.", ""]
        lines += _table(header, [_sweep_cells(report, r) for r in capped])
        be_cap = break_even_acceptance(report.sweep_rows(cap))
        lines += ["", f"Break-even at {cap} token{'s' if cap != 1 else ''} a draft: speculation pays from P ~ "
                  f"{be_cap:.2f} upward." if be_cap is not None else
                  f"At {cap} token{'s' if cap != 1 else ''} a draft the median speed-up does not cross 1.0 inside "
                  "the sweep.", ""]
    placed = placements(report)
    if placed:
        lines += ["### The measured algorithms on the P axis", "",
                  "The measured algorithms placed on the P axis (P = the share of their drafts whose first token "
                  "landed, all classes), each read off the sweep whose draft length matches how it drafts (its mean "
                  "drafted tokens per verify, rounded; the nearest sweep that ran"
                  + ("" if report.capped_lengths() else f": only the one at the window, {window} tokens; "
                     "`--oracle-draft N` adds shorter ones") + "). The sweep's speed-up at that P stands against "
                  "what the algorithm itself measured; a learned drafter's later tokens land less often than an "
                  "oracle's, so it sits below its point:", ""]
        lines += _table(["algorithm", "P", "drafts / verify", "sweep read (draft length)", "sweep at P", "measured"], [
            [pl.name, f"{pl.p:.2f}", f"{pl.drafted_per_verify:.2f}",
             f"{pl.sweep_length}" + (" (the window)" if pl.sweep_length == window else ""),
             "-" if pl.at is None else f"{pl.at:.2f}x", "-" if pl.own is None else f"{pl.own:.2f}x"]
            for pl in placed])
        lines.append("")
    return lines


def loop_verify_cost(report: "BenchReport") -> dict[int, float]:
    """{rows: R(rows)} from the loop's own steps: for each timed oracle run with the governor off
    (every step verifies its draft length + 1 rows), its verify phase per verify step over the
    plain phase per step of the plain run of the same prompt and round; the median per row
    count. Paired like every ratio of the bench, so a slow stretch of a shared machine moves
    both sides."""
    plain = {(r.case_id, r.rep): r.stats.phase_ms.get("plain", 0.0) / r.stats.plain_steps
             for r in report.records if r.kind == PLAIN and not r.warmup and r.stats.plain_steps}
    by_rows: dict[int, list[float]] = {}
    for r in report.records:
        if r.kind != ORACLE or r.warmup or not r.stats.verify_steps:
            continue
        base = plain.get((r.case_id, r.rep))
        if base and not report.oracle_governed(r):
            by_rows.setdefault(report.oracle_draft_length(r) + 1, []).append(
                r.stats.phase_ms.get("verify", 0.0) / r.stats.verify_steps / base)
    return {rows: statistics.median(v) for rows, v in sorted(by_rows.items())}


BENCH_SOURCE, STEPS_SOURCE, PROFILE_SOURCE = "bench", "steps", "profile"
SOURCE_LABELS = {BENCH_SOURCE: "measured now", STEPS_SOURCE: "loop steps", PROFILE_SOURCE: "target's profile"}


def cost_sources(report: "BenchReport") -> dict[str, dict[int, float]]:
    """{source: {rows: R(rows)}} for every verify width up to the window's, from each source this
    run has, in the order the section prefers them: the bench's own timing after the runs
    (``meta["row_cost"]``, tight and paired), the loop's steps (oracle with the governor off,
    only when they reach the window's width: no extrapolation), the target's cached profile
    (``spec_verify_row_ms``)."""
    settings = report.meta["settings"]
    window = settings["window"]
    rows = list(range(2, window + 2))  # every verify width up to the window's
    out: dict[str, dict[int, float]] = {}
    measured = (report.meta.get("row_cost") or {}).get("cost") or {}
    bench = relative_costs(shape_from_steps(1.0, {int(r): c for r, c in measured.items()}), rows)
    if bench and max(int(r) for r in measured) >= max(rows):
        out[BENCH_SOURCE] = bench
    loop = loop_verify_cost(report)
    if loop and max(loop) >= max(rows):
        # medians of a busy machine's steps may fall with rows: made monotone, as every profile is
        loop = dict(monotone([(1, 1.0), *loop.items()])[1:])
        steps = relative_costs(shape_from_steps(1.0, loop), rows)
        if steps:
            out[STEPS_SOURCE] = steps
    profile = relative_costs(settings.get("verify_row_ms"), rows)
    if profile:
        out[PROFILE_SOURCE] = profile
    return out


def drafter_needs_of(report: "BenchReport") -> DrafterNeeds:
    """The section's figures from this run: the cost by rows (the first of ``cost_sources``; the
    others kept beside for comparison), a plain step's ms and each measured algorithm's draft
    time and acceptance (``auto`` is a mix of them and is left out). A drafter's draft time per
    token: its draft phase over the tokens it drafted, a declined proposal counting as one (it
    drafted at least one token that never reached a verify)."""
    sources = cost_sources(report)
    source = next(iter(sources), None)
    costs = sources.pop(source) if source else None
    measures = []
    for row in report.rows_of(ALGORITHM, ALL_CLASSES):
        if row.config == AUTO:
            continue
        drafted = row.draft_tokens + row.declined_drafts
        measures.append(DrafterMeasure(
            row.config, row.phase_ms.get("draft", 0.0) * row.runs / drafted if drafted else None,
            row.draft_tokens / row.verify_steps if row.verify_steps else 0.0,
            list(row.accepted_per_position), row.ratio_median, row.verify_steps, row.tokens_per_verify))
    return drafter_needs(costs, source, report.meta["settings"]["window"], plain_step_ms(report), measures,
                         beside=sources)


def _source_text(report: BenchReport, source: str) -> str:
    """Where a cost by rows came from, in words."""
    if source == BENCH_SOURCE:
        rc = report.meta.get("row_cost") or {}
        return (f"the bench's own timing after its runs (forwards of 1 to {report.meta['settings']['window'] + 1} rows "
                f"after {rc.get('context')} tokens of its prompts, alternating, each over the 1-row forward of its "
                f"round, the median of {rc.get('rounds')} rounds, monotone; 1 row {_fmt(rc.get('one_row_ms'))} ms)")
    if source == STEPS_SOURCE:
        measured = ", ".join(str(r) for r in (1, *loop_verify_cost(report)))
        return ("the loop's own steps (an oracle run's verify phase per step with the governor off over the plain "
                "phase per step of the plain run of its prompt and round, the median over those pairs, overhead "
                f"included; measured at {measured} rows, linear between them)")
    return ("the target's own profile (`spec_verify_row_ms`, what the runtime prices drafts by: a bare forward "
            "timed when first read, paired per round like the bench's own timing, then cached per file and machine)")


def _needs_section(report: BenchReport) -> list[str]:
    needs = drafter_needs_of(report)
    if not needs.machine and not needs.drafters:
        return []
    goal = f"{needs.goal}x"
    lines = ["## What a drafter needs on this machine", "",
             "Computed from this run's measurements only. A step that drafts k tokens verifies them in one forward "
             "of k + 1 rows and costs C(k) = R(k + 1) + k d plain steps: R(r) is the target's cost of an r-row "
             "forward over a 1-row one, d a drafter's draft time per drafted token over a plain step. If every "
             "drafted token lands with the same chance a once the ones before it did, the step emits "
             "1 + a + ... + a^k tokens, and its speed-up over plain decoding is that over C(k). Break-even a: "
             f"speed-up 1; a for {goal}: the goal for a learned drafter; ceiling: a = 1, a perfect drafter "
             "of that length.", ""]
    if needs.costs is None:
        lines += ["No cost by rows was measured in this run (the target could not be timed by rows, publishes no "
                  "profile, and no oracle sweep ran with the governor off up to the window), so there is nothing to "
                  "weigh acceptance against."]
    else:
        lines.append("Cost by rows (x one row), from " + _source_text(report, needs.source) + "."
                     + "".join(f" Beside it, {_source_text(report, name)}." for name in needs.beside))
        lines += ["", "With free drafting (d = 0):", ""]
        beside = list(needs.beside or {})
        header = ["k", "verify rows", f"cost (x one row, {SOURCE_LABELS[needs.source]})",
                  *(SOURCE_LABELS[name] for name in beside), "break-even a", f"a for {goal}", "ceiling (a = 1)"]
        lines += _table(header, [
            [str(n.k), str(n.k + 1), f"{n.verify_cost:.2f}", *(_fmt(needs.beside[name].get(n.k + 1)) for name in beside),
             _fmt(n.break_even), _fmt(n.goal), f"{n.ceiling:.2f}x"]
            for n in needs.machine])
        lines += ["", needs.machine_verdict]
    lines.append("")
    if not needs.drafters:
        lines += ["No drafting algorithm was measured in this run (only the oracle): the figures above are the "
                  "machine's alone.", ""]
        return lines
    ks = "/".join(str(n.k) for n in needs.machine) or "-"
    plain_ms = needs.plain_ms
    lines += [f"Each measured algorithm under its own draft cost (d: its draft phase over the tokens it drafted, a "
              "declined proposal counting as one; a call that proposed nothing costs time and adds no token, so d is "
              f"an upper bound; a plain step is {_fmt(plain_ms)} ms here). Drafting k tokens is "
              "priced at k times that: a chained drafter's cost (a drafter that drafts a block in one pass pays "
              "less at larger k). Accepted at positions 1..3: the share of its drafts whose token i landed. Its verify "
              "steps' worth: its tokens per verify over the cost of a step at its mean draft length (what its "
              "speculative steps gain by these costs; the measured speed-up also counts the steps it did not "
              f"draft). A verdict needs at least {MIN_VERIFIED} verified drafts.", ""]
    body = []
    for d in needs.drafters:
        m = d.measure
        cost = "-" if m.draft_ms_per_token is None else f"{m.draft_ms_per_token:.2f} ({_fmt(d.draft_share)})"
        body.append([m.name, str(m.verified), f"{m.drafted_per_verify:.2f}", cost,
                     " ".join(f"{x:.2f}" for x in m.accepted[:3]) or "-",
                     " / ".join(_fmt(n.goal) for n in d.needs) or "-",
                     " / ".join(f"{n.ceiling:.2f}x" for n in d.needs) or "-",
                     "-" if d.worth is None else f"{d.worth:.2f}x",
                     "-" if m.speedup is None else f"{m.speedup:.2f}x"])
    lines += _table(["algorithm", "verified drafts", "drafts / verify", "draft ms a token (x plain step)",
                     "accepted at 1..3", f"a for {goal} at k = {ks}", f"ceiling at k = {ks}",
                     "its verify steps' worth", "measured"], body)
    lines.append("")
    lines += [f"- **{d.measure.name}**: {d.verdict}" for d in needs.drafters]
    return lines + [""]


def _sweep_cells(report: BenchReport, r: SummaryRow) -> list[str]:
    """One row of a sweep table."""
    return [f"{r.acceptance_target:.2f}", "on" if report.oracle_governed(r) else "off",
            f"{r.acceptance_rate:.2f}", f"{r.tokens_per_verify:.2f}",
            f"{r.tokens_per_second:.1f}", f"{r.plain_tokens_per_second:.1f}", _ratio_text(r),
            f"{r.verify_ms_per_step:.1f}", f"{r.phase_ms.get('rollback', 0.0):.1f}",
            f"{r.governor_wins}/{r.governor_losses}/{r.governor_parked_steps}"]


def _peer_section(report: BenchReport) -> list[str]:
    if not report.peer_rows and not report.peer_errors:
        return []
    lines = ["## Peers on the same GGUF", "",
             "Each peer runs in its own process with its own default environment (tsspec's environment without "
             "the OpenMP wait and thread settings and without tsspec's own TS_* settings), threads = cores, and gets the token ids tsspec encoded (same "
             "chat template, prompts, budget, greedy). Each peer run follows the tsspec run of the same prompt and "
             "round (plain after tsspec plain, prompt lookup after tsspec's first algorithm), so 'tsspec / this' is "
             "a median of paired ratios. Timed over decoding only. transformers runs `generate()` on the model "
             "dequantised from the GGUF, with `prompt_lookup_num_tokens=N` for prompt lookup; llama.cpp runs through "
             "llama-cpp-python (built by `python -m tsspec_bench.peer_build` with explicit SIMD flags chosen from this "
             "CPU's flags, never GGML_NATIVE; its own system-info line is below), with "
             "`LlamaPromptLookupDecoding(num_pred_tokens=N)` and `logits_all=True` for prompt lookup (the library "
             "turns `logits_all` on for any draft model, since it samples each drafted position from its own row: "
             "every verify computes the output head on all its rows). The variants (draft length N, "
             "both engines' default 10; for llama.cpp also the API `generate` / `create_completion` and flash "
             "attention off / on) are probed in stages (plain variants on the first prompt; draft lengths, then "
             "API and flash attention at the best length, on the first prompt of an input-grounded class: "
             "code-edit, summary, qa or rewrite, where goal 3 compares prompt lookup), and the fastest of each "
             "kind is used. A `best` row pairs tsspec's speculative run with the faster of the peer's plain "
             "and prompt lookup in each pair (the peer's best mode for that prompt), and says how often each mode won.",
             "", f"Command: `{report.meta['command']}`", ""]
    probe_rows = []
    for name, info in (report.meta.get("settings", {}).get("peers") or {}).items():
        env = ", ".join(f"{k}={v}" for k, v in info.get("environment", {}).items()) or "no OpenMP settings"
        reps = (report.meta.get("settings", {}).get("peer_reps") or {}).get(name)
        lines.append(f"- {name}: {info.get('threads')} threads; used {info.get('chosen')}; environment: {env}"
                     + (f"; {reps} paired round{'s' if reps != 1 else ''} per prompt" if reps else "")
                     + (f"; the probe took {info['probe_seconds']:.0f} s" if info.get("probe_seconds") else ""))
        own = info.get("info") or {}
        if own.get("system"):
            lines.append(f"  - its system info (`llama_cpp.llama_print_system_info()`): `{own['system']}`")
        if own.get("lookup"):
            lines.append(f"  - its prompt lookup: `{own['lookup']}`")
        chosen = set((info.get("chosen") or {}).values())
        for p in info.get("probe", []):
            probe_rows.append([name, p.get("stage", "-"), f"`{p['variant']}`", f"{p['tokens_per_second']:.1f}",
                               "used" if p["variant"] in chosen else ""])
    if probe_rows:
        lines += ["", "The probe (decode tok/s, medians of the rounds of each stage):", ""]
        lines += _table(["engine", "stage", "variant", "tok/s", ""], probe_rows)
    lines.append("")
    header = ["engine", "config", "class", "tok/s", "speed-up vs own plain (min-max)", "tsspec / this (paired)",
              "output = own plain", "output = tsspec plain"]
    body = []
    for r in report.peer_rows:
        rel = f"{r.tsspec_over_this:.2f}x ({r.tsspec_config})" if r.tsspec_over_this else "-"
        config = r.config if not r.modes else f"{r.config} ({', '.join(f'{m} {n}' for m, n in r.modes.items())})"
        body.append([r.engine, config, f"**{r.cls}**" if r.cls == ALL_CLASSES else r.cls,
                     f"{r.tokens_per_second:.1f}", _ratio_text(r), rel,
                     f"{r.same_as_own_plain}/{r.runs}", f"{r.same_as_tsspec_plain}/{r.runs}"])
    lines += _table(header, body)
    for name, error in report.peer_errors.items():
        lines += ["", f"- {name}: not measured ({error})"]
    return lines + [""]


def _goal_section(report: BenchReport) -> list[str]:
    rows = report.goal_rows()
    if not rows:
        return []
    lines = ["## The CPU speed goals", "",
             "Each ratio is a median of paired ratios from this run; the peers ran in their own processes.", ""]
    body = [[str(g.number), g.name, g.figure, "-" if g.ratio is None else f"{g.ratio:.2f}x", g.goal,
             "-" if g.met is None else ("met" if g.met else "NOT met")] for g in rows]
    lines += _table(["#", "goal", "measured", "ratio", "target", "verdict"], body)
    lines += _physics_lines(report)
    p = (report.goals or {}).get("prefill")
    if p:
        for name, cell in p.get("peers", {}).items():
            probe = ", ".join(f"{k}={v}" for q in cell.get("probe", []) for k, v in q.items())
            lines += ["", f"Prefill, {name}: {cell['median_tps']:.0f} tok/s with {cell['setting'] or 'its defaults'}"
                      + (f" (probe: {probe})" if probe else "") + f"; tsspec {p['tsspec_median_tps']:.0f} tok/s."]
    return lines + [""]


def _physics_lines(report: BenchReport) -> list[str]:
    """The physical picture of a step on this machine (goals.measure_goals, physics.picture),
    in words, every figure from this run."""
    goals = report.goals or {}
    ph, m = goals.get("physics"), goals.get("machine")
    if not ph or not m:
        return []
    from .goals import GOAL_VERIFY

    gb, k = 1e9, ph["rows"]
    file_text = f"; the GGUF file's tensors: {ph['file_bytes'] / 1e6:.1f} MB" if ph.get("file_bytes") else ""
    lines = ["", "### The physical picture (measured in this run)", "",
             f"- Weights a step streams: {ph['weight_bytes'] / 1e6:.1f} MB as tsspec holds them in memory "
             f"({ph['weights'] / 1e6:.1f} M multiply-add weights{file_text}). The floors below count these "
             "matrices only: attention's KV reads and multiply-adds, which grow with the context, come on top.",
             f"- Memory read bandwidth (a sum over {m['bandwidth_buffer_mib']} MiB, best of a few): "
             f"{m['read_bytes_per_s_1'] / gb:.1f} GB/s on 1 thread, {m['read_bytes_per_s'] / gb:.1f} GB/s on "
             f"{m['threads']}; at the best, streaming the weights once takes at least {ph['stream_ms']:.2f} ms a "
             f"step: at most {ph['stream_tps']:.0f} tok/s"
             + (f" ({ph['file_bytes'] / ph['read_bytes_per_s'] * 1e3:.2f} ms, "
                f"{ph['read_bytes_per_s'] / ph['file_bytes']:.0f} tok/s for the file's bytes)." if ph.get("file_bytes") else "."),
             f"- float32 multiply-add rate ({m['matmul_size']}x{m['matmul_size']} torch matmul, best of a few): "
             f"{m['float32_flops_1'] / gb:.0f} GFLOP/s on 1 thread, {m['float32_flops_n'] / gb:.0f} GFLOP/s on "
             f"{m['threads']}"
             + (f"; the CPU's fused multiply-add peak (the compiled kernels' probe: independent FMA chains, "
                f"per CPU second of a core, times {m['threads']}): {m['fma_peak_flops_n'] / gb:.0f} GFLOP/s"
                if m.get("fma_peak_flops_n") else "")
             + " (the floors use the best of these figures: on a shared machine another job can hold a core).",
             f"- A 1-row forward does {ph['flops_1'] / gb:.2f} GFLOP ({ph['compute_ms_1']:.2f} ms at the "
             f"best rate); a {k}-row verify does {ph['flops_k'] / gb:.2f} GFLOP "
             f"({ph['compute_ms_k']:.2f} ms). Floors: 1 row {ph['floor_1_ms']:.2f} ms, {k} rows "
             f"{ph['floor_k_ms']:.2f} ms ({'arithmetic' if ph['compute_ms_k'] > ph['stream_ms'] else 'streaming'}-bound).",
             ]
    if ph.get("one_row_ms"):
        lines.append(f"- Measured at {goals['verify']['context']} tokens of context: 1 row {ph['one_row_ms']:.1f} ms "
                     f"({ph['one_row_over_floor']:.2f}x its floor), {k} rows {ph.get('rows_ms', 0):.1f} ms "
                     f"({ph.get('rows_over_floor', 0):.2f}x its floor).")
    if ph.get("ratio_floor_int8"):
        v2 = goals.get("verify_second")
        lines.append(f"- int8 multiply-add peak (the compiled kernels' probe: the int8 path's own dot instructions, "
                     f"independent accumulators, per CPU second of a core, times {m['threads']}): "
                     f"{ph['int8_ops'] / gb:.0f} GOP/s, {ph['int8_ops'] / ph['float32_flops']:.2f}x the float32 rate "
                     f"above. A {k}-row verify's multiply-adds take {ph['compute_ms_k_int8']:.2f} ms at it; floors "
                     f"with int8 arithmetic: 1 row {ph['floor_1_ms_int8']:.2f} ms, {k} rows {ph['floor_k_ms_int8']:.2f} ms, "
                     f"{k}-row / 1-row >= {ph['ratio_floor_int8']:.2f}x"
                     + (f"; measured with --dtype {v2['dtype']}: 1 row {v2['one_row_ms']:.1f} ms, {k} rows "
                        f"{v2['rows_ms']:.1f} ms ({v2['ratio']:.2f}x paired)." if v2 else "."))
    step = plain_step_ms(report)
    if step:
        lines.append(f"- Plain decoding in this run: a one-row step takes {step:.2f} ms on average (plain runs, all "
                     f"classes), {step / ph['floor_1_ms']:.2f}x the floor.")
    llama = [r.tokens_per_second for r in report.peer_records
             if r.engine == "llama.cpp" and r.config == PLAIN and r.rep >= 0 and r.tokens_per_second]
    if llama and ph.get("file_bytes"):
        ll_ms = 1e3 / statistics.median(llama)
        ll_floor = ph["file_bytes"] / ph["read_bytes_per_s"] * 1e3
        lines.append(f"- llama.cpp's plain decoding in this run: {ll_ms:.2f} ms a token (median), "
                     f"{ll_ms / ll_floor:.2f}x the streaming floor of the file's bytes ({ll_floor:.2f} ms).")
    lines.append(f"- Lower bound of the {k}-row / 1-row ratio with float32 arithmetic on this machine: "
                 f"{ph['ratio_floor']:.2f}x when both forwards run at their floors"
                 + (f"; {ph['ratio_floor_vs_measured']:.2f}x against today's 1-row forward" if ph.get("one_row_ms") else "")
                 + f". Goal 1 asks for <= {GOAL_VERIFY}x: "
                 + ("float32 arithmetic can reach it in principle." if ph["ratio_floor"] <= GOAL_VERIFY else
                    f"float32 multiply-adds alone cannot reach it once the 1-row step is at its floor ({k} rows of "
                    "arithmetic outweigh one pass over the weights); only a faster arithmetic (int8 or bf16 dot "
                    "products) lowers that floor."))
    return lines


def _governor_section(report: BenchReport) -> list[str]:
    if not report.governor:
        return []
    s = report.governor[0].settings
    lines = [
        "## Cost governor goals", "",
        "Paired runs on the exact toy target, each forward padded by a fixed cost profile (once measured "
        f"on the embedded model, not this run's measurement; one-row step {s['base_ms']} ms; relative cost by rows "
        f"{', '.join(f'{r}: {c}' for r, c in s['cost_profile'])}; a KV rewind on rejection, like a llama model). "
        f"{s['cases']} prompts of {s['prompt_tokens']} tokens, {s['max_tokens']} new tokens, draft window "
        f"{s['window']}, {s['reps']} reps; a fresh governor per request, as `tsspec generate` has. "
        "Never-accepting = oracle at P = 0 (every drafted token wrong), always-accepting = oracle at P = 1.",
        "",
        "Two clocks: **virtual** time advances only by the cost profile (the governor's policy alone, "
        "deterministic); **wall** forwards sleep to their cost, so the loop's own overhead and the shared "
        "machine's noise count too.", "",
        f"Command: `{report.meta['command']}` (its `--governor-check` part)", "",
    ]
    header = ["clock", "figure", "tok/s", "reference tok/s", "ratio (min-max)", "goal", "verdict",
              "wins/losses/parked steps"]
    body = []
    for check in report.governor:
        for f in check.figures:
            verdict = "-" if f.passed is None else ("pass" if f.passed else "**miss**")
            body.append([check.settings["clock"], f.name, f"{f.tokens_per_second:.1f}",
                         f"{f.reference_tokens_per_second:.1f}",
                         f"{f.ratio_median:.3f} ({f.ratio_min:.2f}-{f.ratio_max:.2f})",
                         "-" if f.goal is None else f">= {f.goal}", verdict, f"{f.wins}/{f.losses}/{f.parked_steps}"])
    return lines + _table(header, body) + [""]


def _lossless_section(report: BenchReport) -> list[str]:
    t = report.lossless_totals()
    if not t["speculative_runs"]:
        return []
    lines = ["## Losslessness", "",
             f"{t['speculative_runs']} speculative runs compared token by token with the plain reference of their "
             f"prompt: {t['identical']} identical, {t['ties']} diverged at a float tie (plain top-1 vs the "
             f"speculative token within 1e-3 in the logits, recomputed by a plain forward), "
             f"{t['mismatches']} real mismatches."]
    for d in t["details"][:10]:
        lines.append(f"- {d['status']}: {d['case']} / {d['config']} rep {d['rep']}: {d['reason']}")
    return lines + [""]


def _reading(report: BenchReport) -> list[str]:
    lines = ["## Reading", ""]
    band = report.band
    lines.append(f"- **Noise**: the control row (plain against plain) ranged {band.text()}; a figure inside "
                 "that spread is no measured difference, and only one outside it is called a win or a loss."
                 if band is not None and band.judges else
                 f"- **Noise**: the control row has only {band.pairs} plain/plain pair{'s' if band.pairs != 1 else ''} "
                 f"(at least {MIN_BAND_PAIRS} make a spread), so no figure is called a win or a loss."
                 if band is not None else "- **Noise**: no control row ran, so no figure is called a win or a loss.")
    for algo in report.algorithms():
        cells = [r for r in report.rows if r.config == algo and r.cls != ALL_CLASSES and r.ratio_median is not None]
        overall = next((r for r in report.rows if r.config == algo and r.cls == ALL_CLASSES), None)
        if not cells or overall is None:
            continue
        wins = [r for r in cells if band is not None and band.verdict(r.ratio_median) == "wins"]
        loses = [r for r in cells if band is not None and band.verdict(r.ratio_median) == "loses"]
        best = max(cells, key=lambda r: r.ratio_median)
        worst = min(cells, key=lambda r: r.ratio_median)
        text = (f"- **{algo}** {_verdict_word(overall.ratio_median, band)} overall: median speed-up "
                f"{overall.ratio_median:.2f}x over plain ({overall.tokens_per_second:.1f} vs "
                f"{overall.plain_tokens_per_second:.1f} tok/s), acceptance {overall.acceptance_rate:.2f}, "
                f"{overall.tokens_per_verify:.2f} tokens per verify. ")
        text += (f"It wins on {', '.join(f'{r.cls} ({r.ratio_median:.2f}x)' for r in wins)}. " if wins
                 else "It wins on no prompt class. " if band is not None and band.judges else "")
        if loses:
            text += f"It loses on {', '.join(f'{r.cls} ({r.ratio_median:.2f}x)' for r in loses)}. "
        text += (f"Best: {best.cls} ({best.ratio_median:.2f}x, acceptance {best.acceptance_rate:.2f}); "
                 f"worst: {worst.cls} ({worst.ratio_median:.2f}x, acceptance {worst.acceptance_rate:.2f}).")
        lines.append(text)
    oracle = report.sweep_rows()
    if oracle:
        top = oracle[-1]
        be = break_even_acceptance(oracle)
        plain_ms = plain_step_ms(report, report.meta["settings"].get("oracle_classes"))
        cost = top.verify_ms_per_step / plain_ms if plain_ms and top.verify_ms_per_step else None
        text = "- **What limits it**: "
        if cost:
            text += (f"a verify of {report.meta['settings']['window'] + 1} rows (draft and acceptance included) "
                     f"costs {cost:.2f}x a one-row plain step here ({top.verify_ms_per_step:.1f} vs {plain_ms:.1f} ms), "
                     f"so a step must gain more than {cost - 1:.2f} extra tokens to pay. ")
        if be is not None:
            text += f"In the oracle sweep speculation pays once each drafted token is right with P ~ {be:.2f} or more; "
        text += (f"at P = {top.acceptance_target:.2f} the speed-up is {top.ratio_median:.2f}x "
                 f"({top.tokens_per_verify:.2f} tokens per verify). ")
        governed = report.oracle_rows(governor=True)
        if governed and governed[0].ratio_median is not None:
            low = governed[0]
            text += (f"At P = {low.acceptance_target:.2f} the cost governor holds it to {low.ratio_median:.2f}x of plain "
                     f"({low.governor_losses} losses, {low.governor_parked_steps} parked steps).")
        lines.append(text)
    for engine in dict.fromkeys(r.engine for r in report.peer_rows):
        lookup = next((r for r in report.peer_rows if r.engine == engine and r.config == LOOKUP and r.cls == ALL_CLASSES), None)
        plain = next((r for r in report.peer_rows if r.engine == engine and r.config == PLAIN and r.cls == ALL_CLASSES), None)
        if lookup is None or plain is None:
            continue
        text = (f"- **{engine}** on the same GGUF, in its own process: plain {plain.tokens_per_second:.1f} tok/s"
                + (f" (tsspec plain is {plain.tsspec_over_this:.2f}x of it, paired runs"
                   f"{_noise_note(plain.tsspec_over_this, band)})" if plain.tsspec_over_this else "")
                + f"; its prompt lookup runs at {lookup.ratio_median:.2f}x of its own plain"
                + _noise_note(lookup.ratio_median, band)
                + f" and its output equals its plain output in {lookup.same_as_own_plain}/{lookup.runs} runs"
                + f" (tsspec's plain output: {plain.same_as_tsspec_plain}/{plain.runs} of its plain runs).")
        best = next((r for r in report.peer_rows if r.engine == engine and r.config == BEST and r.cls == ALL_CLASSES), None)
        if best is not None and best.tsspec_over_this:
            modes = ", ".join(f"{m} in {n}" for m, n in (best.modes or {}).items())
            text += (f" Against its best mode per pair ({modes} of {best.runs} pairs) tsspec's {best.tsspec_config} "
                     f"runs at {best.tsspec_over_this:.2f}x{_noise_note(best.tsspec_over_this, band)}.")
        lines.append(text)
    for check in report.governor:
        parts = [f"{f.name}: {f.ratio_median:.3f}x ({'pass' if f.passed else 'MISS'} against >= {f.goal})"
                 for f in check.figures if f.goal is not None]
        lines.append(f"- **Cost governor** on the emulated cost profile, {check.settings['clock']} clock: "
                     + "; ".join(parts) + ".")
    t = report.lossless_totals()
    if t["speculative_runs"]:
        ties = f", {t['ties']} float ties" if t["ties"] else ""
        lines.append(f"- **Losslessness**: {t['identical']}/{t['speculative_runs']} speculative runs identical to plain"
                     f"{ties}, {t['mismatches']} mismatches.")
    headline = _headline(report)
    if headline:
        lines += ["", "Headline: " + headline]
    return lines + [""]


def _noise_note(ratio: float | None, band: NoiseBand | None) -> str:
    """' (within noise)' when ``ratio`` lies inside the control row's spread, ' (unjudged: no
    control row)' without one, else nothing: the figure then stands as a difference."""
    if ratio is None:
        return ""
    if band is None:
        return " (unjudged: no control row)"
    verdict = band.verdict(ratio)
    if verdict == "unjudged":
        return f" (unjudged: {band.pairs} control pair{'s' if band.pairs != 1 else ''})"
    return " (within noise)" if verdict == "within noise" else ""


def _headline(report: BenchReport) -> str:
    parts = []
    for algo in report.algorithms():
        overall = next((r for r in report.rows if r.config == algo and r.cls == ALL_CLASSES), None)
        cells = [r for r in report.rows if r.config == algo and r.cls != ALL_CLASSES and r.ratio_median is not None]
        if overall is None or overall.ratio_median is None or not cells:
            continue
        best = max(cells, key=lambda r: r.ratio_median)
        worst = min(cells, key=lambda r: r.ratio_median)
        parts.append(f"{algo} {overall.ratio_median:.2f}x of plain over all classes"
                     f"{_noise_note(overall.ratio_median, report.band)} "
                     f"({worst.cls} {worst.ratio_median:.2f}x to {best.cls} {best.ratio_median:.2f}x)")
    for engine in dict.fromkeys(r.engine for r in report.peer_rows):
        lookup = next((r for r in report.peer_rows if r.engine == engine and r.config == LOOKUP and r.cls == ALL_CLASSES), None)
        if lookup is not None and lookup.ratio_median is not None:
            parts.append(f"{engine} prompt lookup {lookup.ratio_median:.2f}x of its plain"
                         f"{_noise_note(lookup.ratio_median, report.band)}")
    return "; ".join(parts) + "." if parts else ""
