"""``tsspec bench``: paired, alternating measurements of speculation against plain decoding.

Exit codes: 0 when every speculative run reproduced plain decoding (identically, or through a
float tie), 1 when any run produced a different token (a losslessness failure: the outputs are
still written, so the failure can be inspected), 2 for usage errors.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from tsspec.errors import OptionsError
from tsspec.cli import flags
from tsspec.cli.state import STATE

EXIT_MISMATCH = 1
QUICK_REPS, QUICK_PER_CLASS, QUICK_MAX_TOKENS = 2, 1, 32
DEFAULT_REPS = 5
TABLE_WIDTH = 160
BENCH_PANEL = "Benchmark"
OUTPUT_PANEL = "Output"


def _split(values: list[str] | str | None) -> list[str]:
    """'a,b' and repeated flags alike -> ['a', 'b']."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _acceptances(text: str | None) -> list[float]:
    out = []
    for item in _split(text):
        try:
            value = float(item)
        except ValueError:
            raise OptionsError(f"--oracle-acceptance takes numbers between 0 and 1, got {item!r}") from None
        if not 0.0 <= value <= 1.0:
            raise OptionsError(f"--oracle-acceptance values must be between 0 and 1, got {value}")
        out.append(value)
    return sorted(set(out))


def _whole(text: str) -> int:
    """``text`` as a whole number, 0 when it is not one (the callers refuse anything below 1)."""
    try:
        return int(text)
    except ValueError:
        return 0


def _draft_caps(text: str | None) -> list[int]:
    """``--oracle-draft``: 'N[,N...]' -> sorted distinct caps, each a whole number >= 1.

    >>> _draft_caps("2,1,2")
    [1, 2]
    """
    out = set()
    for item in _split(text):
        value = _whole(item)
        if value < 1:
            raise OptionsError(f"--oracle-draft takes whole numbers of tokens >= 1, got {item!r}")
        out.add(value)
    return sorted(out)


def bench(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="GGUF file (default: the embedded SmolLM2-135M-Instruct; 'toy' = the exact test toy).")] = None,
    spec_type: Annotated[Optional[str], typer.Option("--spec-type", help="Algorithms to measure, comma separated (default: every registered one that serves the model; 'none' = only the oracle/governor parts).", rich_help_panel=flags.SPEC_PANEL)] = None,
    reps: Annotated[Optional[int], typer.Option("--reps", min=1, help=f"Paired repetitions per prompt (default {DEFAULT_REPS}).", rich_help_panel=BENCH_PANEL)] = None,
    quick: Annotated[bool, typer.Option("--quick", help=f"Smoke run: {QUICK_REPS} reps, {QUICK_PER_CLASS} prompt per class, {QUICK_MAX_TOKENS} new tokens.", rich_help_panel=BENCH_PANEL)] = False,
    prompts: Annotated[Optional[str], typer.Option("--prompts", help="Your own prompts (JSONL: class, prompt or messages, max_tokens).", rich_help_panel=BENCH_PANEL)] = None,
    classes: Annotated[Optional[str], typer.Option("--classes", help="Only these prompt classes (comma separated).", rich_help_panel=BENCH_PANEL)] = None,
    per_class: Annotated[Optional[int], typer.Option("--per-class", min=1, help="At most N prompts of each class.", rich_help_panel=BENCH_PANEL)] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", "-n", min=1, help="Override every prompt's token budget.", rich_help_panel=BENCH_PANEL)] = None,
    oracle_acceptance: Annotated[Optional[str], typer.Option("--oracle-acceptance", help="Oracle sweep: P[,P...] = chance each drafted token is right.", rich_help_panel=BENCH_PANEL)] = None,
    oracle_classes: Annotated[Optional[str], typer.Option("--oracle-classes", help="Run the oracle sweep on these classes only.", rich_help_panel=BENCH_PANEL)] = None,
    oracle_governor: Annotated[str, typer.Option("--oracle-governor", help="The sweep's cost governor: on, off, both, or 'options' (follow --spec-adaptive).", rich_help_panel=BENCH_PANEL)] = "options",
    oracle_draft: Annotated[Optional[str], typer.Option("--oracle-draft", help="Run the oracle sweep's P values again with drafts capped at N tokens (N[,N...], below the draft window; governor off), so a drafter that drafts N tokens is read off a sweep of its own length.", rich_help_panel=BENCH_PANEL)] = None,
    compare: Annotated[Optional[List[str]], typer.Option("--compare", help="Peer on the same GGUF: transformers, llama.cpp (repeatable or comma separated).", rich_help_panel=BENCH_PANEL)] = None,
    compare_reps: Annotated[Optional[str], typer.Option("--compare-reps", help="Paired reps for the peers (default: --reps): N, and/or ENGINE=N for one engine (e.g. 2,transformers=1).", rich_help_panel=BENCH_PANEL)] = None,
    governor_check: Annotated[bool, typer.Option("--governor-check", help="Also measure the cost governor's goals on a toy with the embedded model's cost profile.", rich_help_panel=BENCH_PANEL)] = False,
    goals: Annotated[bool, typer.Option("--goals", help="Also measure the CPU speed goals: verify cost by rows, prefill of 1,000 tokens (beside the --compare peers).", rich_help_panel=BENCH_PANEL)] = False,
    goals_dtype: Annotated[Optional[str], typer.Option("--goals-dtype", help="With --goals and --compare llama.cpp: the --dtype of a second plain-decode row beside goal 2, paired with llama.cpp's plain runs (default int8: llama.cpp's arithmetic on a Q4_1 file).", rich_help_panel=BENCH_PANEL)] = None,
    governor_reps: Annotated[int, typer.Option("--governor-reps", min=1, help="Paired reps of the governor check.", rich_help_panel=BENCH_PANEL)] = 3,
    families: Annotated[Optional[str], typer.Option("--families", help="Also measure model families' draft heads (gemma4,glm-dsa) on tiny random targets whose drafters are distilled briefly on the targets' greedy outputs: synthetic, not a real-model speed.", rich_help_panel=BENCH_PANEL)] = None,
    json_path: Annotated[Optional[str], typer.Option("--json", help="Write every run and summary as JSON.", rich_help_panel=OUTPUT_PANEL)] = None,
    markdown_path: Annotated[Optional[str], typer.Option("--markdown", help="Write the report as Markdown (BENCHMARKS.md).", rich_help_panel=OUTPUT_PANEL)] = None,
    plot_path: Annotated[Optional[str], typer.Option("--plot", help="Write a PNG plot (needs matplotlib).", rich_help_panel=OUTPUT_PANEL)] = None,
    temperature: flags.Temperature = None,
    top_k: flags.TopK = None,
    top_p: flags.TopP = None,
    min_p: flags.MinP = None,
    repeat_penalty: flags.RepeatPenalty = None,
    seed: flags.Seed = None,
    device: flags.Device = "cpu",
    dtype: flags.Dtype = None,
    spec_draft: flags.SpecDraft = None,
    spec_pmin: flags.SpecPmin = None,
    spec_draft_model: flags.SpecDraftModel = None,
    draft_model: flags.DraftModel = None,
    spec_adaptive: flags.Adaptive = None,
) -> None:
    """Measure speculation against plain decoding: paired runs, per prompt class, lossless-checked."""
    from rich.console import Console

    from tsspec_bench.prompts import load_prompt_set, select_cases, shipped_prompts_path
    from tsspec_bench.suite import BenchPlan, model_label, run_plan
    from tsspec.cli.generate_cmd import load_target

    console = Console(stderr=True)
    options = flags.speculation_options(True, None, spec_draft, spec_pmin, spec_draft_model, draft_model, spec_adaptive)
    sampling = flags.sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    algorithms = None
    if spec_type is not None:
        names = _split(spec_type)
        algorithms = [] if names == ["none"] else names
    if quick:
        reps = reps or QUICK_REPS
        per_class = per_class or QUICK_PER_CLASS
        max_tokens = max_tokens or QUICK_MAX_TOKENS
    reps = reps or DEFAULT_REPS
    cases = select_cases(load_prompt_set(prompts), _split(classes) or None, per_class)
    if max_tokens is not None:
        import attrs

        cases = [attrs.evolve(c, max_tokens=max_tokens) for c in cases]
    peers = _split(compare)
    from tsspec_bench.peers import PEER_NAMES

    for name in peers:
        if name not in PEER_NAMES:
            raise OptionsError(f"--compare {name}: choose from {', '.join(PEER_NAMES)}")
    default_peer_reps, peer_reps = _peer_reps(compare_reps, PEER_NAMES)
    from tsspec_bench.families import parse_families

    family_names = parse_families(families)

    model_path = model
    if model is None:  # the default model a plugin offers, as a path
        from tsspec.runtime.named_models import default_model, resolve_model_path

        model_path = str(resolve_model_path(default_model(STATE.catalog), STATE.catalog))
    from tsspec.runtime.loading import file_less_entry

    file_less = file_less_entry(model_path, STATE.catalog) is not None
    with console.status(f"loading {model_label(model_path)}"):
        target = load_target(model_path, device, dtype, options)
    if getattr(target, "tokenizer", None) is None:
        raise OptionsError("tsspec bench needs a model with a tokenizer")

    plan = BenchPlan(
        model_name=model_label(model_path),
        model_path=None if file_less else str(Path(model_path).resolve()),
        cases=cases,
        prompts_label=prompts or f"the shipped set ({shipped_prompts_path().name})",
        algorithms=algorithms,
        oracle_acceptance=_acceptances(oracle_acceptance),
        oracle_classes=_split(oracle_classes) or None,
        oracle_governor=_oracle_governor(oracle_governor),
        oracle_draft=_draft_caps(oracle_draft),
        reps=reps,
        options=options,
        sampling=sampling,
        compare=peers,
        compare_reps=default_peer_reps,
        peer_reps=peer_reps,
        governor_check=governor_check,
        goals=goals,
        goals_dtype=goals_dtype,
        governor_reps=governor_reps,
        command=_command_line(),
        device=device,
        dtype=dtype,
    )

    def on_mismatch(record) -> None:
        console.print(f"[red bold]LOSSLESSNESS FAILURE[/red bold] {record.case_id} / {record.config} rep {record.rep}: "
                      f"{record.verdict.reason}")

    def on_peer_error(name: str, error: str) -> None:
        console.print(f"[yellow]peer {name} skipped: {error}[/yellow]")

    report = _run_with_progress(console, plan, target, on_mismatch, on_peer_error)
    out = Console()
    if not out.is_terminal:
        out = Console(width=TABLE_WIDTH)  # a file or a pipe: do not squeeze the table into 80 columns
    report.print_tables(out)
    family_results = _run_families(console, family_names, out)
    if json_path:
        report.write_json(json_path)
        if family_names:
            from tsspec_bench.families import add_json

            add_json(json_path, family_results)
        console.print(f"wrote {json_path}")
    if plot_path:
        from tsspec_bench.plot import write_plot

        write_plot(report, plot_path)
        console.print(f"wrote {plot_path}")
    if markdown_path:
        report.write_markdown(markdown_path, plot_path)
        if family_names:
            from tsspec_bench.families import append_markdown

            append_markdown(markdown_path, family_results)
        console.print(f"wrote {markdown_path}")
    changed = len(report.mismatches) + sum(r.mismatched for r in family_results)
    if changed:
        console.print(f"[red bold]tsspec bench: {changed} speculative run(s) or family configuration(s) changed the "
                      "output: speculation must be lossless[/red bold]")
        raise typer.Exit(EXIT_MISMATCH)


def _run_families(console, names: list[str], out) -> list:
    """The --families section: measured after the main runs, printed as its own tables."""
    if not names:
        return []
    from tsspec_bench.families import print_section, run_families

    results = run_families(names, STATE.catalog,
                           progress=lambda text: console.print(f"[families] {text}", highlight=False, markup=False))
    print_section(results, out)
    return results


def _run_with_progress(console, plan, target, on_mismatch, on_peer_error):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tsspec_bench.suite import run_plan

    if not console.is_terminal:  # a log file: one line per run instead of a live bar
        def log_line(phase: str, done: int, total: int, text: str) -> None:
            if text:
                console.print(f"[{phase}] {done}/{total or '?'} {text}", highlight=False, markup=False)

        return run_plan(plan, target, catalog=STATE.catalog, progress=log_line,
                        on_mismatch=on_mismatch, on_peer_error=on_peer_error)
    with Progress(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[last]}"), console=console, transient=False) as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int, text: str) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total or None, last=text)
            bar.update(tasks[phase], completed=done, total=total or None, last=text)

        return run_plan(plan, target, catalog=STATE.catalog, progress=progress,
                        on_mismatch=on_mismatch, on_peer_error=on_peer_error)


def _peer_reps(text: str | None, names) -> tuple[int | None, dict[str, int]]:
    """``--compare-reps``: 'N' and/or 'ENGINE=N' items -> (N or None, {engine: N}).

    >>> _peer_reps("2,transformers=1", ("transformers", "llama.cpp"))
    (2, {'transformers': 1})
    """
    default, per_engine = None, {}
    for item in _split(text):
        name, _, value = item.rpartition("=")
        reps = _whole(value)
        if reps < 1:
            raise OptionsError(f"--compare-reps takes N or ENGINE=N with N >= 1, got {item!r}")
        if not name:
            default = reps
        elif name in names:
            per_engine[name] = reps
        else:
            raise OptionsError(f"--compare-reps {item}: no peer {name!r} (choose from {', '.join(names)})")
    return default, per_engine


ORACLE_GOVERNOR_CHOICES = {"options": (None,), "on": (True,), "off": (False,), "both": (False, True)}


def _oracle_governor(text: str) -> tuple:
    try:
        return ORACLE_GOVERNOR_CHOICES[text]
    except KeyError:
        raise OptionsError(f"--oracle-governor takes {', '.join(ORACLE_GOVERNOR_CHOICES)}, got {text!r}") from None


def _command_line() -> str:
    args = sys.argv[1:]
    return "tsspec " + " ".join(shlex.quote(a) for a in args) if args else "tsspec bench"
