"""Speculation options: one attrs object resolved from, strongest first, CLI flags, the
environment (``TS_SPEC_*``, else ``TS_MTP_*``), the config's ``[spec]`` and defaults. Once
resolved they are published under BOTH prefixes (native loaders read ``TS_MTP_*``).
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, MutableMapping

import attrs

from ..errors import OptionsError

DEFAULT_DRAFT_WINDOW = 8
MIN_DRAFT_WINDOW = 1
MAX_DRAFT_WINDOW = 64

# option field -> (environment suffix after TS_SPEC_ / TS_MTP_, config [spec] key, flag)
FIELDS = {
    "enabled": ("SPEC", "enabled", "--spec/--no-spec"),
    "spec_type": ("TYPE", "type", "--spec-type"),
    "draft": ("DRAFT", "draft", "--spec-draft"),
    "pmin": ("PMIN", "pmin", "--spec-pmin"),
    "spec_draft_model": ("DRAFT_MODEL", "spec_draft_model", "--spec-draft-model"),
    "draft_model": ("DRAFTER", "draft_model", "--draft-model"),
    "adaptive": ("ADAPTIVE", "adaptive", "--spec-adaptive"),
}
ENV_PREFIXES = ("TS_SPEC_", "TS_MTP_")
CONFIG_KEYS = {key: field for field, (_, key, _) in FIELDS.items()}
TUNING_FIELDS = ("spec_type", "draft", "pmin", "spec_draft_model", "draft_model")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _check_draft(instance, attribute, value):
    if value is not None and not (MIN_DRAFT_WINDOW <= value <= MAX_DRAFT_WINDOW):
        raise OptionsError(
            f"--spec-draft must be between {MIN_DRAFT_WINDOW} and {MAX_DRAFT_WINDOW}, got {value}"
        )


def _check_pmin(instance, attribute, value):
    if value is not None and (math.isnan(value) or not 0.0 <= value <= 1.0):
        raise OptionsError(f"--spec-pmin must be between 0 and 1, got {value}")


@attrs.frozen
class SpeculationOptions:
    """What the operator asked of speculation. ``explicit`` names the fields the operator set."""

    enabled: bool = True
    spec_type: str = "auto"
    draft: int | None = attrs.field(default=None, validator=_check_draft)  # None: per target
    pmin: float | None = attrs.field(default=None, validator=_check_pmin)  # None: per algorithm
    spec_draft_model: str | None = None
    draft_model: str | None = None
    adaptive: bool = True
    explicit: frozenset[str] = frozenset()
    extra: Mapping[str, Any] = attrs.field(factory=dict)  # plugin-specific settings

    @property
    def drafter_path(self) -> str | None:
        """The drafter file the operator attached (either spelling)."""
        return self.draft_model or self.spec_draft_model

    def window(self, preferred: int | None = None) -> int:
        """Draft window: the operator's value, else the default narrowed by the target's."""
        if self.draft is not None:
            return self.draft
        if preferred:
            return max(MIN_DRAFT_WINDOW, min(DEFAULT_DRAFT_WINDOW, int(preferred)))
        return DEFAULT_DRAFT_WINDOW

    def ignored_tuning_warnings(self) -> list[str]:
        """One line per tuning flag that has no effect because speculation is off."""
        if self.enabled:
            return []
        return [
            f"warning: {FIELDS[name][2]} has no effect with speculation off (--no-spec)"
            for name in TUNING_FIELDS
            if name in self.explicit
        ]

    def env_items(self) -> dict[str, str]:
        """The resolved options as environment variables, under both prefixes."""
        values = {
            "enabled": "1" if self.enabled else "0",
            "spec_type": self.spec_type,
            "draft": str(self.window()),
            "pmin": "" if self.pmin is None else repr(float(self.pmin)),
            "spec_draft_model": self.spec_draft_model or "",
            "draft_model": self.draft_model or "",
            "adaptive": "1" if self.adaptive else "0",
        }
        return {
            prefix + FIELDS[field][0]: value
            for field, value in values.items()
            for prefix in ENV_PREFIXES
        }

    def publish(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Write env_items() into ``environ`` (default: os.environ)."""
        target = os.environ if environ is None else environ
        target.update(self.env_items())

    @classmethod
    def resolve(
        cls,
        cli: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> "SpeculationOptions":
        """Merge ``cli`` (flags given, not None), ``env`` and ``config`` (the validated ``[spec]``)."""
        values: dict[str, Any] = {}
        explicit: set[str] = set()
        for key, value in (config or {}).items():
            values[CONFIG_KEYS[key]] = value
            explicit.add(CONFIG_KEYS[key])
        for field, value in _from_env(env if env is not None else os.environ).items():
            values[field] = value
            explicit.add(field)
        for field, value in (cli or {}).items():
            if value is not None:
                values[field] = value
                explicit.add(field)
        if values.get("pmin") is not None:
            values["pmin"] = float(values["pmin"])
        a, b = values.get("draft_model"), values.get("spec_draft_model")
        if a and b and a != b:
            raise OptionsError(
                f"--draft-model {a} and --spec-draft-model {b} conflict: attach one drafter file"
            )
        return cls(**values, explicit=frozenset(explicit), extra=dict(extra or {}))


def _parse_env(name: str, raw: str, field: str) -> Any:
    text = raw.strip()
    if field in ("enabled", "adaptive"):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise OptionsError(f"{name}={raw!r} is not a boolean (use 1 or 0)")
    if field == "draft":
        try:
            return int(text)
        except ValueError:
            raise OptionsError(f"{name}={raw!r} is not an integer") from None
    if field == "pmin":
        try:
            return float(text)
        except ValueError:
            raise OptionsError(f"{name}={raw!r} is not a number") from None
    return text


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """Options set in the environment. TS_SPEC_* wins over TS_MTP_* when both are set."""
    out: dict[str, Any] = {}
    for field, (suffix, _, _) in FIELDS.items():
        for prefix in reversed(ENV_PREFIXES):  # TS_MTP_ first so TS_SPEC_ overrides
            name = prefix + suffix
            raw = env.get(name)
            if raw is None or raw == "":
                continue
            out[field] = _parse_env(name, raw, field)
    return out
