"""The ``tsspec.toml`` config file: found at ``--config``, ``$TSSPEC_CONFIG``, ``./tsspec.toml`` or
the user's config dir (a file named explicitly must exist); unknown keys and wrong types are
errors naming the key. ``[plugin.NAME]`` tables are checked by their plugin (``plugin_section``)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError

# section -> key -> accepted python types
SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "plugins": {"enabled": (list,), "disabled": (list,)},
    "spec": {
        "enabled": (bool,),
        "type": (str,),
        "draft": (int,),
        "pmin": (int, float),
        "draft_model": (str,),
        "spec_draft_model": (str,),
        "adaptive": (bool,),
    },
    "sampling": {
        "temperature": (int, float),
        "top_k": (int,),
        "top_p": (int, float),
        "min_p": (int, float),
        "repeat_penalty": (int, float),
        "seed": (int,),
    },
    "model": {"path": (str,), "device": (str,), "dtype": (str,)},
}
PLUGIN_SECTION = "plugin"  # [plugin.NAME]: a plugin's own table, its keys checked by the plugin


def find_config(explicit: str | os.PathLike | None, env: Mapping[str, str]) -> Path | None:
    """Return the config file to read, or None. An explicitly named file must exist."""
    for named in (explicit, env.get("TSSPEC_CONFIG") or None):
        if named:
            path = Path(named)
            if not path.is_file():
                raise ConfigError(f"config file {path} does not exist")
            return path
    local = Path("tsspec.toml")
    if local.is_file():
        return local
    base = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    user = base / "tsspec" / "tsspec.toml"
    return user if user.is_file() else None


def validate(data: Mapping[str, Any], source: str = "config",
             schema: Mapping[str, Mapping[str, tuple[type, ...]]] = SCHEMA) -> dict[str, dict[str, Any]]:
    """Check ``data`` against ``schema``; return it as plain dicts. Errors name the offending key."""
    out: dict[str, dict[str, Any]] = {}
    for section, values in data.items():
        if section == PLUGIN_SECTION and isinstance(values, Mapping):
            for name, table in values.items():
                if not isinstance(table, Mapping):
                    raise ConfigError(f"{source}: [{PLUGIN_SECTION}.{name}] must be a table")
            out[section] = {name: dict(table) for name, table in values.items()}
            continue
        if section not in schema:
            known = ", ".join([*schema, PLUGIN_SECTION + ".NAME"])
            raise ConfigError(f"{source}: unknown section [{section}] (known: {known})")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{source}: [{section}] must be a table")
        known = schema[section]
        for key, value in values.items():
            if key not in known:
                raise ConfigError(
                    f"{source}: unknown key {section}.{key} (known: {', '.join(known)})"
                )
            types = known[key]
            # bool is an int subclass: a bool where a number is expected is a type error
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                names = " or ".join(t.__name__ for t in types)
                raise ConfigError(
                    f"{source}: {section}.{key} must be {names}, got {type(value).__name__}"
                )
            if types == (list,) and not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{source}: {section}.{key} must be a list of strings")
        out[section] = dict(values)
    return out


def load_config(path: Path | None) -> dict[str, dict[str, Any]]:
    """Read and validate a config file; None gives an empty config."""
    if path is None:
        return {}
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    return validate(raw, source=str(path))


def plugin_section(config: Mapping[str, Any], plugin: str, schema: Mapping[str, tuple[type, ...]],
                   source: str = "config") -> dict[str, Any]:
    """Plugin ``plugin``'s ``[plugin.NAME]`` table checked against its ``schema``; {} when absent."""
    name = f"{PLUGIN_SECTION}.{plugin}"
    table = dict((config.get(PLUGIN_SECTION) or {}).get(plugin) or {})
    return validate({name: table}, source=source, schema={name: schema})[name] if table else {}
