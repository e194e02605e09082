"""``tsspec bench --families``: each model family's draft head on a trained-to-agree tiny setup.

Per family: a tiny random target built from a seed with transformers (the families' oracle),
converted and loaded through whatever plugins registered the converter and the loader (none is
imported here), its drafter distilled briefly on the target's own greedy outputs, then greedy
runs in paired, alternating order: plain, plain again (the control row), draft-head and ngram,
on prompts the drafter was distilled on (trained to agree). Every run's tokens are compared with
plain's. A family whose plugin (or transformers) is absent is reported "not installed". The
models are random and tiny: the figures are the mechanics (acceptance, tokens per verify, the
loop's cost), not a real-model speed.
"""

from __future__ import annotations

import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import attrs

from tsspec.errors import OptionsError

PLAIN, CONTROL, DRAFT_HEAD, NGRAM = "plain", "plain (control)", "draft-head", "ngram"
CONFIGS = (PLAIN, CONTROL, DRAFT_HEAD, NGRAM)
NOT_REAL = "synthetic tiny model, not a real-model speed"


@attrs.frozen
class FamilySize:
    """How big a family run is (``FULL`` for ``make bench``, smaller ones for tests)."""

    distill_steps: int = 120
    train_sequences: int = 12
    prompts: int = 3
    reps: int = 2
    max_tokens: int = 24
    draft: int = 3
    seed: int = 0


FULL = FamilySize()


@attrs.frozen
class Requirement:
    """What a family needs registered: model loaders, converters, drafter attaches."""

    plugin: str
    models: tuple[str, ...] = ()
    converters: tuple[str, ...] = ()
    drafters: tuple[str, ...] = ()

    def missing(self, catalog) -> str | None:
        """Why the family cannot run here, or None."""
        absent = [f"model {a}" for a in self.models if a not in catalog.models]
        absent += [f"converter {c}" for c in self.converters if c not in catalog.converters]
        absent += [f"drafter {d}" for d in self.drafters if d not in catalog.drafters]
        if absent:
            return f"not installed: no loaded plugin registers {', '.join(absent)} ({self.plugin})"
        if importlib.util.find_spec("transformers") is None:
            return "not installed: transformers (the tiny random targets are built with it)"
        return None


@attrs.define
class FamilyRow:
    config: str
    tokens_per_second: float  # median over timed runs (decode, prefill excluded)
    ratio_median: float | None  # tok/s over plain's, per pair (same prompt, same round)
    ratio_min: float | None
    ratio_max: float | None
    pairs: int
    acceptance: float | None
    tokens_per_verify: float | None
    drafted: int
    equal_to_plain: bool
    speculator: str | None = None
    decline: str | None = None


@attrs.define
class FamilyResult:
    family: str
    status: str  # "measured", "not installed", "failed"
    reason: str = ""
    rows: list[FamilyRow] = attrs.field(factory=list)
    setup: str = ""  # what was built and how the distillation went
    seconds: float = 0.0
    size: FamilySize = FULL

    @property
    def mismatched(self) -> bool:
        return any(not r.equal_to_plain for r in self.rows)

    def to_json(self) -> dict:
        return attrs.asdict(self)


def parse_families(text: str | None) -> list[str]:
    """``--families``: 'a,b' -> known family names in the order given (OptionsError otherwise)."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    for name in names:
        if name not in FAMILIES:
            raise OptionsError(f"--families {name}: choose from {', '.join(FAMILIES)}")
    return list(dict.fromkeys(names))


def run_families(names: Sequence[str], catalog, size: FamilySize | None = None,
                 progress: Callable[[str], None] | None = None) -> list[FamilyResult]:
    """Build, distil and measure each family in ``names`` (``size`` None: ``FULL``); one result each."""
    size = size or FULL
    say = progress or (lambda text: None)
    results = []
    for name in names:
        family = FAMILIES[name]
        why = family.requirement.missing(catalog)
        if why is not None:
            results.append(FamilyResult(name, "not installed", why, size=size))
            say(f"{name}: {why}")
            continue
        start = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix=f"tsspec-bench-{name}-") as root:
                target, setup = family.build(catalog, size, Path(root), say)
                rows = measure(target, catalog, distilled_prompts(target.config.vocab_size, size), size, say)
        except Exception as exc:  # recorded, never silent: the section prints it
            results.append(FamilyResult(name, "failed", f"{type(exc).__name__}: {exc}",
                                        seconds=time.perf_counter() - start, size=size))
            say(f"{name}: failed: {exc}")
            continue
        results.append(FamilyResult(name, "measured", rows=rows, setup=setup, seconds=time.perf_counter() - start,
                                    size=size))
    return results


def distilled_prompts(vocab: int, size: FamilySize) -> list[list[int]]:
    """The first ``size.prompts`` of the prompts whose continuations the drafter was distilled on
    (trained to agree: on held-out prompts a drafter distilled this briefly rarely lands)."""
    from .family_builds import train_prompts

    return train_prompts(vocab, size)[: size.prompts]


def _options(config: str, size: FamilySize):
    from tsspec import SpeculationOptions

    if config in (PLAIN, CONTROL):
        return SpeculationOptions(enabled=False)
    extra = {"pmin": 0.0} if config == DRAFT_HEAD else {}
    return SpeculationOptions(spec_type=config, draft=size.draft, adaptive=False, **extra)


def measure(target, catalog, prompts: list[list[int]], size: FamilySize, say) -> list[FamilyRow]:
    """Greedy runs of every configuration per prompt and round, the order reversed every other
    pair; one warm-up run of each first. Ratios are per pair against plain's run."""
    from tsspec import generate

    registry = catalog.speculators

    def run(config: str, prompt: list[int]):
        return generate(target, prompt, _options(config, size), max_tokens=size.max_tokens, registry=registry,
                        stop_tokens=())

    for config in CONFIGS:
        run(config, prompts[0])
    speeds = {c: [] for c in CONFIGS}
    ratios = {c: [] for c in CONFIGS}
    counts = {c: [0, 0, 0] for c in CONFIGS}  # drafted, accepted, verify steps
    equal = dict.fromkeys(CONFIGS, True)
    served: dict[str, tuple[str | None, str | None]] = {}
    for rep in range(size.reps):
        for i, prompt in enumerate(prompts):
            order = CONFIGS if (rep * len(prompts) + i) % 2 == 0 else CONFIGS[::-1]
            outs = {c: run(c, prompt) for c in order}
            plain = outs[PLAIN]
            for config, out in outs.items():
                s = out.stats
                speeds[config].append(s.tokens_per_second)
                ratios[config].append(s.tokens_per_second / plain.stats.tokens_per_second)
                counts[config][0] += s.draft_tokens
                counts[config][1] += s.accepted_tokens
                counts[config][2] += s.verify_steps
                equal[config] &= list(out.tokens) == list(plain.tokens)
                decline = getattr(out.decline, "reason", None) if out.decline is not None else None
                served.setdefault(config, (out.speculator, decline))
        say(f"round {rep + 1}/{size.reps}")
    rows = []
    for config in CONFIGS:
        drafted, accepted, verifies = counts[config]
        r = ratios[config] if config != PLAIN else []
        rows.append(FamilyRow(
            config, statistics.median(speeds[config]),
            statistics.median(r) if r else None, min(r) if r else None, max(r) if r else None, len(r),
            accepted / drafted if drafted else None, (accepted + verifies) / verifies if verifies else None,
            drafted, equal[config], *served.get(config, (None, None))))
    return rows


@attrs.frozen
class Family:
    requirement: Requirement
    builder: str  # the function in family_builds: (catalog, size, root, say) -> (target with its head, setup text)

    def build(self, catalog, size: FamilySize, root: Path, say):
        from . import family_builds

        return getattr(family_builds, self.builder)(catalog, size, root, say)


FAMILIES: dict[str, Family] = {
    "gemma4": Family(Requirement("tsspec-model-gemma4", models=("gemma4",),
                                 converters=("gemma4_text", "gemma4_assistant"), drafters=("gemma4-assistant",)),
                     "build_gemma4"),
    "glm-dsa": Family(Requirement("tsspec-model-glm-dsa", models=("glm-dsa",), converters=("glm_moe_dsa",)),
                      "build_glm_dsa"),
}


# ----------------------------------------------------------------------------- output

def _ratio(row: FamilyRow) -> str:
    if row.ratio_median is None:
        return "1.00x (reference)"
    return f"{row.ratio_median:.2f}x ({row.ratio_min:.2f}-{row.ratio_max:.2f}, {row.pairs} pairs)"


def _cells(row: FamilyRow) -> list[str]:
    acc = "-" if row.acceptance is None else f"{row.acceptance:.2f}"
    per_verify = "-" if row.tokens_per_verify is None else f"{row.tokens_per_verify:.2f}"
    equal = "yes" if row.equal_to_plain else "NO"
    note = f"declined: {row.decline}" if row.decline else ""
    return [row.config, f"{row.tokens_per_second:.1f}", _ratio(row), acc, per_verify, equal, note]


HEADER = ["configuration", "tok/s", "speed-up vs plain (min-max)", "acceptance", "tok/verify", "equal to plain", ""]


def markdown(results: Sequence[FamilyResult]) -> list[str]:
    """The BENCHMARKS.md section."""
    size = results[0].size if results else FULL
    lines = [f"## Model families: draft heads on trained-to-agree tiny models ({NOT_REAL})", "",
             "Each family's tiny random target is built from a seed (transformers), converted and loaded "
             "by its plugin; its drafter is distilled briefly on the target's own greedy outputs. Greedy "
             f"runs on {size.prompts} of the prompts whose continuations the drafter was distilled on x {size.reps} rounds, {size.max_tokens} new tokens, "
             f"draft window {size.draft}, cost governor off, order alternating per pair; the control row is "
             "plain against plain. Speed-up: the median per-pair tok/s ratio, with its range.", ""]
    for res in results:
        lines.append(f"### {res.family}")
        lines.append("")
        if res.status != "measured":
            lines += [f"{res.status}: {res.reason}", ""]
            continue
        lines += [f"{res.setup} ({res.seconds:.0f} s in all). {NOT_REAL}.", ""]
        lines.append("| " + " | ".join(HEADER[:-1] + ["note"]) + " |")
        lines.append("|" + "---|" * len(HEADER))
        lines += ["| " + " | ".join(_cells(r)) + " |" for r in res.rows]
        lines.append("")
    return lines


def print_section(results: Sequence[FamilyResult], console) -> None:
    from rich.table import Table

    for res in results:
        if res.status != "measured":
            console.print(f"model family {res.family}: {res.status}: {res.reason}")
            continue
        table = Table(title=f"{res.family}: {NOT_REAL}", caption=res.setup)
        for col in HEADER:
            table.add_column(col)
        for row in res.rows:
            table.add_row(*_cells(row))
        console.print(table)


def append_markdown(path: str | Path, results: Sequence[FamilyResult]) -> None:
    """Add the section at the end of the report ``tsspec bench --markdown`` wrote."""
    file = Path(path)
    text = file.read_text() if file.exists() else ""
    file.write_text(text.rstrip("\n") + "\n\n" + "\n".join(markdown(results)).rstrip("\n") + "\n")


def add_json(path: str | Path, results: Sequence[FamilyResult]) -> None:
    """Add the families' results under ``"families"`` to the report ``--json`` wrote."""
    import json

    file = Path(path)
    data = json.loads(file.read_text())
    data["families"] = [r.to_json() for r in results]
    file.write_text(json.dumps(data, indent=2) + "\n")
