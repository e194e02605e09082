"""``tsspec plugins`` and ``tsspec list-speculators``: what is installed, and why an algorithm
would or would not serve a model."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from .state import STATE

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def plugins(as_json: JsonFlag = False) -> None:
    """List installed plugins: package, version, hooks, status and reason."""
    catalog = STATE.catalog
    records = [r.to_json() for r in catalog.host.list_records()]
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    if not records:
        typer.echo("no tsspec plugins installed")
        return
    for r in records:
        hooks = ",".join(h.removeprefix("tsspec_register_") for h in r["hooks"]) or "-"
        line = f"{r['name']:<14} {r['status']:<9} {r['package'] or '-'} {r['version'] or '-'}  hooks: {hooks}"
        if r["reason"]:
            line += f"  ({r['reason']})"
        typer.echo(line)


def evaluate_speculators(catalog, target, options) -> list[dict]:
    """One row per registered algorithm; with a target, whether it would serve it or why not."""
    import attrs

    from ..runtime.registry import Decline

    rows = []
    for entry in catalog.speculators.entries():
        row = {
            "name": entry.name,
            "plugin": entry.plugin,
            "package": entry.package,
            "version": entry.version,
            "requires_draft_head": entry.requires_draft_head,
            "description": entry.description,
            "status": "registered",
            "code": None,
            "reason": None,
        }
        if target is not None:
            made = catalog.speculators.create(target, attrs.evolve(options, spec_type=entry.name))
            if isinstance(made, Decline):
                row.update(status="declined", code=made.code, reason=made.reason)
            else:
                row.update(status="serves")
                try:
                    made.close()
                except Exception:
                    pass
        rows.append(row)
    return rows


def list_speculators(
    model: Annotated[Optional[str], typer.Option("--model", help="GGUF file: say whether each algorithm serves it.")] = None,
    draft_model: Annotated[Optional[str], typer.Option("--draft-model", "--spec-draft-model", help="Drafter file to attach.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List speculation algorithms; with --model, whether each would serve it or why not."""
    from ..runtime.loading import load_model
    from ..runtime.options import SpeculationOptions
    from ..runtime.registry import Decline

    catalog = STATE.catalog
    target = None
    options = SpeculationOptions(draft_model=draft_model)
    if model is not None:
        # the drafter is left to each factory (it stays in the options), so a drafter that does
        # not fit the model shows up as a decline reason instead of stopping the listing
        target = load_model(model, catalog=catalog, options=SpeculationOptions())
    rows = evaluate_speculators(catalog, target, options)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no speculation algorithms registered (is any plugin installed and enabled?)")
    for r in rows:
        head = "needs drafter" if r["requires_draft_head"] else "weight-free"
        line = f"{r['name']:<12} {r['status']:<10} {head:<13} {r['plugin'] or '-'} {r['version'] or '-'}"
        if r["reason"]:
            line += f"\n    {r['code']}: {r['reason']}"
        elif r["description"]:
            line += f"  {r['description']}"
        typer.echo(line)
    if target is not None:
        head = getattr(target, "draft_head", None)
        source = getattr(head, "source", None)
        if source:
            from ..runtime.bundled import pick

            record = pick(catalog.bundled_drafters, model, "auto") if not draft_model else None
            shipped = f" (shipped by plugin {record.plugin} for this model file)" if record else ""
            typer.echo(f"drafter: {source}{shipped}")
        auto = catalog.speculators.resolve_name(target, "auto")
        text = f"{auto.code}: {auto.reason}" if isinstance(auto, Decline) else auto
        typer.echo(f"auto -> {text}")
    for conflict in catalog.speculators.conflicts:
        typer.echo(f"warning: {conflict}", err=True)
