"""The benchmark's figure: speed-up per prompt class, the oracle sweep, the governor's goals.

matplotlib is an optional extra (``pip install 'tsspec[bench]'``); it is imported here only,
with the non-interactive Agg backend, when ``--plot`` is asked for.
"""

from __future__ import annotations

from pathlib import Path

from tsspec.errors import TsspecError
from .peers import LOOKUP
from .report import BenchReport, break_even_acceptance
from .summary import ALL_CLASSES

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise TsspecError("--plot needs matplotlib: pip install 'tsspec[bench]' (or matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _class_panel(ax, report: BenchReport) -> None:
    classes = [*report.classes, ALL_CLASSES]
    series = []  # (label, {class: (median, min, max)})
    for algo in report.algorithms():
        cells = {r.cls: (r.ratio_median, r.ratio_min, r.ratio_max) for r in report.rows
                 if r.config == algo and r.ratio_median is not None}
        series.append((f"tsspec {algo}", cells))
    for engine in dict.fromkeys(r.engine for r in report.peer_rows):
        cells = {r.cls: (r.ratio_median, r.ratio_min, r.ratio_max) for r in report.peer_rows
                 if r.engine == engine and r.config == LOOKUP and r.ratio_median is not None}
        series.append((f"{engine} prompt lookup", cells))
    classes = [c for c in classes if any(c in cells for _, cells in series)]
    if not series or not classes:
        ax.text(0.5, 0.5, "no speculative algorithm measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    width = 0.8 / len(series)
    for i, (label, cells) in enumerate(series):
        xs, ys, lo, hi = [], [], [], []
        for j, cls in enumerate(classes):
            if cls in cells:
                med, mn, mx = cells[cls]
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(med)
                lo.append(med - mn)
                hi.append(mx - med)
        ax.bar(xs, ys, width * 0.92, yerr=[lo, hi], capsize=2, color=COLOURS[i % len(COLOURS)], label=label,
               error_kw={"elinewidth": 0.8, "ecolor": "#333333"})
        for x, y, up in zip(xs, ys, hi):
            ax.text(x, y + up + 0.02, f"{y:.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.9, linestyle="--")
    band = report.band
    if band is not None:  # what noise alone does to a pair: a median inside it is no difference
        ax.axhspan(band.low, band.high, color="grey", alpha=0.15, label=f"control (plain/plain) {band.text()}")
    ax.set_xticks(range(len(classes)))
    ax.set_xticklabels(classes, rotation=20, ha="right")
    ax.set_ylabel("speed-up over plain\n(median of pairs; whiskers: min-max)")
    ax.set_title("Speculation vs plain decoding, per prompt class")
    top = max([v[2] for _, cells in series for v in cells.values()] + [1.2])
    ax.set_ylim(0, top * 1.15)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)


def _oracle_panel(ax, report: BenchReport) -> None:
    for i, governed in enumerate((False, True)):
        rows = report.oracle_rows(governor=governed)
        if not rows:
            continue
        ps = [r.acceptance_target for r in rows]
        med = [r.ratio_median for r in rows]
        colour = COLOURS[0] if not governed else COLOURS[1]
        label = f"governor {'on' if governed else 'off'}"
        ax.fill_between(ps, [r.ratio_min for r in rows], [r.ratio_max for r in rows], alpha=0.15, color=colour)
        ax.plot(ps, med, marker="o" if not governed else "s", color=colour, label=f"{label}: median (band: min-max)")
        for p, m, r in zip(ps, med, rows):
            note = f"{m:.2f}x" + (f"\n{r.tokens_per_verify:.1f} tok/verify" if not governed else "")
            ax.annotate(note, (p, m), textcoords="offset points", xytext=(0, 8 if not governed else -20),
                        ha="center", fontsize=7, color=colour)
    rows = report.oracle_rows()
    ax.axhline(1.0, color="black", linewidth=0.9, linestyle="--")
    be = break_even_acceptance(report.sweep_rows())
    if be is not None:
        ax.axvline(be, color="grey", linewidth=0.8, linestyle=":")
        ax.text(be, 1.0, f" break-even P~{be:.2f}", fontsize=8, va="bottom")
    ax.set_xlabel("oracle P: probability that each drafted token is right")
    ax.set_ylabel("speed-up over plain")
    ax.set_title(f"Oracle sweep: speed-up vs drafted-token correctness (draft window {report.meta['settings']['window']})")
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(0, max([r.ratio_max for r in rows] + [1.2]) * 1.25)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)


def _governor_panel(ax, report: BenchReport) -> None:
    figures = [f for check in report.governor for f in check.figures]
    labels = [f"{f.name}\n({check.settings['clock']} clock)" for check in report.governor for f in check.figures]
    values = [f.ratio_median for f in figures]
    colours = ["#2ca02c" if f.passed else ("#d62728" if f.passed is False else "#7f7f7f") for f in figures]
    ax.barh(range(len(figures)), values, color=colours,
            xerr=[[f.ratio_median - f.ratio_min for f in figures], [f.ratio_max - f.ratio_median for f in figures]],
            capsize=2)
    for i, f in enumerate(figures):
        ax.text(f.ratio_max + 0.03, i, f"{f.ratio_median:.3f}x" + ("" if f.goal is None else f" (goal >= {f.goal})"),
                va="center", fontsize=8)
    ax.axvline(0.97, color="#d62728", linewidth=0.8, linestyle=":")
    ax.axvline(1.0, color="black", linewidth=0.9, linestyle="--")
    ax.set_yticks(range(len(figures)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio (median of pairs; bars: min-max)")
    ax.set_xlim(0, max(f.ratio_max for f in figures) * 1.35)
    ax.set_title("Cost governor goals (toy with the embedded model's cost profile)")
    ax.grid(axis="x", alpha=0.3)


def write_plot(report: BenchReport, path: str | Path) -> Path:
    """Draw the panels that have data into one PNG."""
    plt = _pyplot()
    panels = [_class_panel]
    if report.oracle_rows():
        panels.append(_oracle_panel)
    if report.governor:
        panels.append(_governor_panel)
    heights = [4.6 if p is not _governor_panel else 1.2 + 0.45 * sum(len(c.figures) for c in report.governor)
               for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for draw, ax in zip(panels, axes[:, 0]):
        draw(ax, report)
    model = report.meta["model"]["name"]
    fig.suptitle(f"tsspec bench: {model}, {report.meta['settings']['reps']} paired reps", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
