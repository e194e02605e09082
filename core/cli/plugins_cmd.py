"""``tsspec plugins`` and ``tsspec list-speculators``: what is installed, and why an algorithm
would or would not serve a model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from .state import STATE

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def kernel_rows(catalog) -> dict[str, list[dict]]:
    """Registered kernels by plugin: op, device, whether usable here and why not."""
    rows: dict[str, list[dict]] = {}
    for op in sorted(catalog.kernels):
        for entry in catalog.kernels[op]:
            rows.setdefault(entry.plugin or "-", []).append(
                {"op": op, "device": entry.device, "available": entry.available, "reason": entry.reason}
            )
    return rows


def _kernel_summary(rows: list[dict]) -> str:
    """One line per plugin: its ops by device and availability ("device found" or the reason)."""
    parts = []
    for device in sorted({r["device"] for r in rows}):
        mine = [r for r in rows if r["device"] == device]
        usable = [r["op"] for r in mine if r["available"]]
        state = "; ".join(sorted({r["reason"] for r in mine if r["reason"]})) or (
            "available" if usable else "unavailable")
        parts.append(f"{device}: {', '.join(r['op'] for r in mine)} ({state})")
    return " | ".join(parts)


def plugins(as_json: JsonFlag = False) -> None:
    """List installed plugins: package, version, hooks, status and reason (and their kernels)."""
    catalog = STATE.catalog
    records = [r.to_json() for r in catalog.host.list_records()]
    kernels = kernel_rows(catalog)
    for r in records:
        if r["name"] in kernels:
            r["kernels"] = kernels[r["name"]]
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
        if r.get("kernels"):
            typer.echo(f"    kernels {_kernel_summary(r['kernels'])}")


def _auto_line(plan, source) -> str:
    """What ``auto`` runs, and with which drafter file, in one line."""
    from ..runtime.registry import Decline

    if isinstance(plan, Decline):
        return f"{plan.code}: {plan.reason}"
    drafter = f" (drafter {source})" if source else ""
    if "+" in plan:
        primary, backup = plan.split("+", 1)
        return (f"{plan}: {primary} proposes first, {backup}{drafter} where {primary} finds nothing "
                f"or its draft does not pay")
    return f"{plan}{drafter}" if plan != "auto" else plan


def _with_shipped_drafters(rows: list[dict], catalog, model: str | None, draft_model: str | None) -> list[dict]:
    """Each row gains ``shipped_drafter``; a ``no_draft_head`` decline that a shipped drafter serves
    becomes ``serves`` (the bare decline kept as ``without_shipped_drafter``)."""
    from ..runtime.registry import NO_DRAFT_HEAD

    for row in rows:
        row["shipped_drafter"] = None
    if not catalog.bundled_drafters:
        return rows
    from ..runtime.bundled import pick

    for row in rows:
        if model is None or draft_model is not None or row["code"] != NO_DRAFT_HEAD:
            continue
        for record in catalog.bundled_drafters:
            if record.algorithm == row["name"] and pick([record], model, record.algorithm) is not None:
                row["without_shipped_drafter"] = {"code": row["code"], "reason": row["reason"]}
                row.update(status="serves", code=None, reason=None, shipped_drafter=str(record.path))
                break
    return rows


def list_speculators(
    model: Annotated[Optional[str], typer.Option("--model", help="GGUF file: say whether each algorithm serves it.")] = None,
    draft_model: Annotated[Optional[str], typer.Option("--draft-model", "--spec-draft-model", help="Drafter file to attach.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List speculation algorithms; with --model, whether each would serve it or why not."""
    from ..runtime.loading import load_model
    from ..runtime.options import SpeculationOptions

    catalog = STATE.catalog
    target = None
    options = SpeculationOptions(draft_model=draft_model)
    if model is not None:
        # the drafter is left to each factory (it stays in the options), so a drafter that does
        # not fit the model shows up as a decline reason instead of stopping the listing
        target = load_model(model, catalog=catalog, options=SpeculationOptions())
    rows = _with_shipped_drafters(catalog.speculators.evaluate(target, options), catalog, model, draft_model)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no speculation algorithms registered (is any plugin installed and enabled?)")
    for r in rows:
        head = "needs drafter" if r["requires_draft_head"] else "weight-free"
        status = r["status"] if not r["shipped_drafter"] else f"serves (shipped drafter: {Path(r['shipped_drafter']).name})"
        line = f"{r['name']:<12} {status:<10} {head:<13} {r['plugin'] or '-'} {r['version'] or '-'}"
        if r["reason"]:
            line += f"\n    {r['code']}: {r['reason']}"
        elif r["description"]:
            line += f"  {r['description']}"
        typer.echo(line)
    if target is not None:
        from ..runtime.bundled import pick

        from ..capabilities import target_info

        source = target_info(target).drafter.source
        if source:
            typer.echo(f"drafter: {source}")
        for record in catalog.bundled_drafters:
            if pick([record], model, record.algorithm) is not None:
                when = "--spec-type auto or " if record.auto else ""
                typer.echo(f"shipped drafter for this model file: {record.path} (plugin {record.plugin}; "
                           f"attached under {when}--spec-type {record.algorithm})")
        planned = target
        if draft_model is not None:  # auto with the operator's drafter attached, as generate would run it
            from ..errors import TsspecError

            try:
                planned = load_model(model, catalog=catalog, options=options)
            except TsspecError as exc:
                typer.echo(f"auto -> (the drafter does not attach: {exc})")
                planned = None
        if planned is not None:
            source = target_info(planned).drafter.source
            typer.echo(f"auto -> {_auto_line(catalog.speculators.auto_plan(planned), source)}")
    for conflict in catalog.speculators.conflicts:
        typer.echo(f"warning: {conflict}", err=True)
