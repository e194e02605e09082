"""Checkpoint conversion: ``tsspec convert`` picks the converter a plugin registered for the
checkpoint's type, read from config.json. Every failure is one ``ConvertError`` line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import attrs

from ..errors import TsspecError

OUTTYPES = ("f32", "f16", "q8_0")
SPECULATORS_TYPE, SPECULATORS_KEY = "speculators_model_type", "speculators"  # the format's marker, its key


class ConvertError(TsspecError):
    """A conversion could not run or failed; one line, exit code 2."""


@attrs.define
class ConverterEntry:
    """A converter for some checkpoint types, with the plugin that registered it."""

    model_types: list[str]
    function: Callable[..., Any]
    description: str = ""
    plugin: str | None = None
    package: str | None = None
    version: str | None = None


def checkpoint_types(src_dir: Path) -> list[str]:
    """Keys a converter may be registered under, most specific first: ``speculators`` (that format),
    config.json's ``architectures``, its ``model_type``."""
    config_path = src_dir / "config.json"
    if not src_dir.is_dir():
        raise ConvertError(f"{src_dir}: not a checkpoint directory")
    if not config_path.is_file():
        raise ConvertError(f"{src_dir}: no config.json (expected a Hugging Face checkpoint directory)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{config_path}: unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise ConvertError(f"{config_path}: not a JSON object")
    keys = [SPECULATORS_KEY] if isinstance(config.get(SPECULATORS_TYPE), str) else []
    keys += [str(a) for a in config.get("architectures") or () if isinstance(a, str)]
    if isinstance(config.get("model_type"), str):
        keys.append(config["model_type"])
    if not keys:
        raise ConvertError(f"{config_path}: no model_type")
    return keys


def find_converter(converters: dict[str, ConverterEntry], src_dir: Path) -> tuple[str, ConverterEntry]:
    """(the matched type, its converter), or a ConvertError listing the known types."""
    keys = checkpoint_types(src_dir)
    for key in keys:
        if key in converters:
            return key, converters[key]
    known = ", ".join(sorted(converters)) or "none (no plugin registers a converter)"
    raise ConvertError(f"{src_dir}: no converter for model_type {keys[-1]!r}; known types: {known}")


def convert_as(model_type: str, src_dir: object, out_path: object, *, outtype: str = "f32", catalog=None,
               **settings: Any) -> ConverterEntry:
    """Convert with the converter registered for ``model_type``, ``settings`` as keywords: how one
    plugin hands a checkpoint to another's converter without importing it."""
    if catalog is None:
        from .defaults import default_catalog

        catalog = default_catalog()
    entry = catalog.converters.get(model_type)
    if entry is None:
        known = ", ".join(sorted(catalog.converters)) or "none"
        raise ConvertError(f"{src_dir}: no loaded plugin converts {model_type!r} checkpoints (known types: {known})")
    entry.function(Path(str(src_dir)), Path(str(out_path)), outtype=outtype, **settings)
    return entry


def convert_checkpoint(catalog, src_dir: object, out_path: object, *, outtype: str = "f32") -> tuple[str, ConverterEntry]:
    """Convert ``src_dir`` to ``out_path`` with the registered converter; returns what ran."""
    if outtype not in OUTTYPES:
        raise ConvertError(f"--outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    src, out = Path(str(src_dir)), Path(str(out_path))
    key, entry = find_converter(catalog.converters, src)
    try:
        entry.function(src, out, outtype=outtype)
    except TsspecError:
        raise
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise ConvertError(
            f"{src}: the {key} converter (plugin {entry.plugin}) failed: {type(exc).__name__}: {exc}"
        ) from exc
    return key, entry
