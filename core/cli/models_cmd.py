"""``tsspec models``: the named models plugins registered and the architectures that load from any
GGUF path."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .state import STATE


def listing(catalog) -> dict:
    named = [
        {"name": e.name, "installed": e.installed, "default": e.default, "description": e.description,
         "plugin": e.plugin}
        for e in sorted(catalog.named_models.values(), key=lambda e: e.name)
    ]
    families = [
        {"architecture": arch, "plugin": e.plugin}
        for arch, e in sorted(catalog.models.items()) if not e.file_less
    ]
    return {"named": named, "architectures": families}


def models(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List named models (--model NAME) and the architectures any GGUF path may have."""
    info = listing(STATE.catalog)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    typer.echo("named models (--model NAME; an Ollama model name resolves to its local blob too):")
    for m in info["named"]:
        state = ("installed" if m["installed"] else "not installed") + (", default" if m["default"] else "")
        typer.echo(f"  {m['name']:<16} {state:<23} {m['description']} (plugin {m['plugin']})")
    if not info["named"]:
        typer.echo("  none")
    typer.echo("architectures that load from any GGUF path (--model FILE):")
    by_plugin: dict[str, list[str]] = {}
    for f in info["architectures"]:
        by_plugin.setdefault(f["plugin"] or "-", []).append(f["architecture"])
    for plugin, archs in sorted(by_plugin.items()):
        typer.echo(f"  {', '.join(archs)} (plugin {plugin})")
