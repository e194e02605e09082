"""SpeculatorRegistry: the only place that knows which algorithms exist, and why one declines.

``create(target, options)`` returns a Speculator or a ``Decline`` with a stable code and an
operator-facing sentence. Codes, in the order they are checked:

* ``refused``        the target refuses speculation outright (outranks everything)
* ``unknown_algorithm`` the name is not registered (the sentence lists the known ones)
* ``no_draft_head``  the algorithm needs trained drafter weights the target does not carry
                     (the sentence names the weight-free alternative)
* ``unprofitable``   the trunk cannot verify profitably without its own drafter
* ``cannot_serve``   the factory declined (None or SpeculatorDeclined), with its reason
* ``plugin_error``   the factory raised anything else
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import attrs

from ..protocols import DraftHeadKind, SpeculatorDeclined

log = logging.getLogger("tsspec.registry")

AUTO = "auto"
WEIGHT_FREE_ALTERNATIVE = "ngram"

REFUSED = "refused"
UNPROFITABLE = "unprofitable"
NO_DRAFT_HEAD = "no_draft_head"
UNKNOWN_ALGORITHM = "unknown_algorithm"
CANNOT_SERVE = "cannot_serve"
PLUGIN_ERROR = "plugin_error"
DECLINE_CODES = (REFUSED, UNPROFITABLE, NO_DRAFT_HEAD, UNKNOWN_ALGORITHM, CANNOT_SERVE, PLUGIN_ERROR)

# --spec-pmin means something different per algorithm, so each has its own default.
DEFAULT_PMIN = {"draft-head": 0.75, "block": 0.35, "ngram": 0.0}
# which built-in algorithm `auto` picks for each kind of drafter a checkpoint carries
AUTO_BY_KIND = {DraftHeadKind.PER_TOKEN: "draft-head", DraftHeadKind.BLOCK: "block"}


@attrs.frozen
class Decline:
    """Why no speculator serves a request: a stable code plus a sentence for the operator."""

    algorithm: str
    code: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"algorithm": self.algorithm, "code": self.code, "reason": self.reason}


@attrs.define
class SpeculatorEntry:
    """One registration, with the plugin that made it."""

    name: str
    factory: Callable[[Any, Any], Any]
    requires_draft_head: bool
    description: str = ""
    plugin: str | None = None
    package: str | None = None
    version: str | None = None
    # what to attach, for the no_draft_head sentence ("a Medusa GGUF with --spec-draft-model PATH")
    drafter_hint: str = ""


def draft_head_kind(target: Any) -> DraftHeadKind:
    head = getattr(target, "draft_head", None)
    return getattr(head, "kind", DraftHeadKind.NONE) if head is not None else DraftHeadKind.NONE


class SpeculatorRegistry:
    """Name -> factory. Fill it with ``register`` (directly or through the plugin hook)."""

    def __init__(self) -> None:
        self._entries: dict[str, SpeculatorEntry] = {}
        self.conflicts: list[str] = []  # duplicate names, kept for the CLI to print

    def register(
        self,
        name: str,
        factory: Callable[[Any, Any], Any],
        *,
        requires_draft_head: bool,
        description: str = "",
        plugin: str | None = None,
        package: str | None = None,
        version: str | None = None,
        drafter_hint: str = "",
    ) -> None:
        if not isinstance(name, str) or not name or name == AUTO:
            raise ValueError(f"invalid speculator name {name!r} ('auto' is reserved)")
        if not callable(factory):
            raise TypeError(f"speculator {name!r}: factory is not callable")
        if name in self._entries:
            first = self._entries[name].plugin
            self.conflicts.append(f"{name}: registered by {first} and again by {plugin}; kept {first}")
            log.warning("speculator %s registered twice (%s, %s): keeping the first", name, first, plugin)
            return
        self._entries[name] = SpeculatorEntry(
            name, factory, bool(requires_draft_head), description, plugin, package, version,
            str(drafter_hint or ""),
        )

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[SpeculatorEntry]:
        return [self._entries[n] for n in self.names()]

    def get(self, name: str) -> SpeculatorEntry | None:
        return self._entries.get(name)

    def default_pmin(self, name: str) -> float:
        return DEFAULT_PMIN.get(name, 0.0)

    def resolve_name(self, target: Any, spec_type: str) -> str | Decline:
        """Map ``auto`` to the algorithm for the drafter the checkpoint carries."""
        if spec_type != AUTO:
            return spec_type
        kind = draft_head_kind(target)
        if kind in AUTO_BY_KIND:
            return AUTO_BY_KIND[kind]
        if getattr(target, "speculation_profitable", True) and WEIGHT_FREE_ALTERNATIVE in self._entries:
            return WEIGHT_FREE_ALTERNATIVE
        return Decline(
            AUTO,
            NO_DRAFT_HEAD,
            "auto: the model carries no drafter; attach one (--draft-model) or choose a "
            f"weight-free algorithm (--spec-type {WEIGHT_FREE_ALTERNATIVE})",
        )

    def check(self, target: Any, name: str, options: Any = None) -> Decline | None:
        """The declines that need no factory call (cheap: a planner can explain up front)."""
        refusal = getattr(target, "speculation_refusal", None)
        if refusal:
            return Decline(name, REFUSED, f"the model refuses speculation: {refusal}")
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join([AUTO, *self.names()]) or AUTO
            return Decline(name, UNKNOWN_ALGORITHM, f"unknown algorithm {name!r}; known: {known}")
        drafter_file = getattr(options, "drafter_path", None)
        if entry.requires_draft_head and draft_head_kind(target) is DraftHeadKind.NONE and not drafter_file:
            return Decline(
                name,
                NO_DRAFT_HEAD,
                f"{name} needs trained drafter weights and the model carries none; attach "
                f"{entry.drafter_hint or 'a drafter file'} or use the weight-free --spec-type "
                f"{WEIGHT_FREE_ALTERNATIVE}",
            )
        if not entry.requires_draft_head and not getattr(target, "speculation_profitable", True):
            return Decline(
                name,
                UNPROFITABLE,
                f"{name}: this model's verify shares a kernel with its own drafter and is not "
                "profitable without it; load its drafter",
            )
        return None

    def create(self, target: Any, options: Any) -> Any:
        """A ready speculator for ``target``, or a Decline saying why not."""
        name = self.resolve_name(target, getattr(options, "spec_type", AUTO))
        if isinstance(name, Decline):
            refusal = getattr(target, "speculation_refusal", None)
            if refusal:
                return Decline(AUTO, REFUSED, f"the model refuses speculation: {refusal}")
            return name
        decline = self.check(target, name, options)
        if decline is not None:
            return decline
        entry = self._entries[name]
        try:
            speculator = entry.factory(target, options)
        except SpeculatorDeclined as exc:
            return Decline(name, CANNOT_SERVE, f"{name} cannot serve this model: {exc}")
        except Exception as exc:
            log.warning("speculator factory %s (plugin %s) raised: %r", name, entry.plugin, exc)
            return Decline(
                name, PLUGIN_ERROR, f"{name} (plugin {entry.plugin}) failed: {type(exc).__name__}: {exc}"
            )
        if speculator is None:
            return Decline(name, CANNOT_SERVE, f"{name} cannot serve this model (its factory declined)")
        try:  # the loop needs these; anything else has a default or is guarded
            missing = [m for m in ("propose", "commit") if not callable(getattr(speculator, m, None))]
            what = f"no callable {', '.join(missing)}" if missing else None
            if what is None and not hasattr(speculator, "needs_hidden_state"):
                what = "no needs_hidden_state"
        except Exception as exc:
            what = f"its attributes raise {type(exc).__name__}"
        if what is not None:
            log.warning("speculator factory %s (plugin %s) returned %s: %s", name, entry.plugin,
                        type(speculator).__name__, what)
            return Decline(
                name, PLUGIN_ERROR,
                f"{name} (plugin {entry.plugin}) failed: its factory returned a "
                f"{type(speculator).__name__}, not a speculator ({what})",
            )
        return speculator

