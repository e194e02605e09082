"""The ``tsspec.toml`` config file: where it is looked up, and strict validation of its keys.

Lookup order: ``--config PATH``, else ``$TSSPEC_CONFIG``, else ``./tsspec.toml``, else
``$XDG_CONFIG_HOME/tsspec/tsspec.toml`` (``~/.config`` when unset). A file named explicitly must
exist; the implicit ones are optional. Unknown keys and wrong types are errors that name the key,
so a typo never silently does nothing.
"""

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


def validate(data: Mapping[str, Any], source: str = "config") -> dict[str, dict[str, Any]]:
    """Check ``data`` against SCHEMA; return it as plain dicts. Errors name the offending key."""
    out: dict[str, dict[str, Any]] = {}
    for section, values in data.items():
        if section not in SCHEMA:
            raise ConfigError(f"{source}: unknown section [{section}] (known: {', '.join(SCHEMA)})")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{source}: [{section}] must be a table")
        known = SCHEMA[section]
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
