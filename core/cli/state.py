"""One CLI invocation's state (plugin controls, config, catalog), filled before typer parses."""

from __future__ import annotations

import os
from typing import Any

import attrs

from ..config import find_config, load_config
from ..plugins import PluginControls


@attrs.define
class CliState:
    config_path: str | None = None
    config: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    controls: PluginControls = attrs.field(factory=PluginControls)
    debug: bool = False
    catalog: Any = None

    @classmethod
    def from_argv(cls, argv: list[str]) -> "CliState":
        """Read the global options that must be known before parsing (config, plugin controls)."""
        config_arg = _value(argv, "--config")
        plugins_arg = _value(argv, "--plugins")
        disabled = _values(argv, "--disable-plugin")
        path = find_config(config_arg, os.environ)
        config = load_config(path)
        controls = PluginControls.resolve(
            cli_plugins=plugins_arg,
            cli_disable=disabled,
            env=os.environ,
            config=config.get("plugins"),
        )
        return cls(str(path) if path else None, config, controls, "--debug" in argv)


def _values(argv: list[str], flag: str) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith(flag + "="):
            out.append(arg.split("=", 1)[1])
    return out


def _value(argv: list[str], flag: str) -> str | None:
    found = _values(argv, flag)
    return found[-1] if found else None


STATE = CliState()
