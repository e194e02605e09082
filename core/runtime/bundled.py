"""Drafter files plugins ship for particular target files, registered as ``files=[{"path",
"algorithm", "target": {"architecture", "shape_digest", "sha256"}, "auto"}]`` through the drafters
hook and keyed by the target file's identity. ``TS_SPEC_BUNDLED=0`` loads models bare."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import attrs

__all__ = ["BundledDrafter", "checked_record", "bundled_record", "pick", "BUNDLED_ENV"]

BUNDLED_ENV = "TS_SPEC_BUNDLED"
AUTO = "auto"


@attrs.frozen
class BundledDrafter:
    path: str
    algorithm: str  # the speculation algorithm the file serves (draft-head, block...)
    target: Any  # the file toolkit's identity of the target file (``matches(path)``)
    description: str = ""
    plugin: str | None = None
    auto: bool = True  # attached under --spec-type auto (False: only for its own algorithm)


def checked_record(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """A registration's ``files`` entry, checked (ValueError when malformed)."""
    target = spec.get("target")
    if not isinstance(target, Mapping) or not target.get("architecture") or not target.get("shape_digest"):
        raise ValueError("a bundled drafter needs target = {architecture, shape_digest[, sha256]}")
    if not spec.get("path"):
        raise ValueError("a bundled drafter needs a path")
    return spec


def bundled_record(spec: Mapping[str, Any], plugin: str | None, identity: Callable[..., Any]) -> BundledDrafter:
    """The record of a checked ``files`` entry, its target made by the toolkit's ``identity``."""
    target = spec["target"]
    return BundledDrafter(
        path=str(spec["path"]),
        algorithm=str(spec.get("algorithm") or ""),
        target=identity(str(target["architecture"]), str(target["shape_digest"]), target.get("sha256") or None),
        description=str(spec.get("description") or ""),
        plugin=plugin,
        auto=bool(spec.get("auto", True)),
    )


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    value = (environ if environ is not None else os.environ).get(BUNDLED_ENV, "1")
    return value.strip().lower() not in ("0", "false", "no", "off")


def pick(records, model_path: object, spec_type: str = AUTO) -> BundledDrafter | None:
    """The bundled drafter for ``model_path`` under ``spec_type``, or None."""
    if not records or not enabled():
        return None
    wanted = [r for r in records if (spec_type == AUTO and r.auto) or r.algorithm == spec_type]
    for record in wanted:
        if Path(record.path).is_file() and record.target.matches(str(model_path)):
            return record
    return None
