"""SpeculatorRegistry: the only place that knows which algorithms exist, and why one declines.

Every fact about an algorithm arrives with its registration (``register(name, factory, *,
requires_draft_head, serves_kind, weight_free, description)``); the registry names
no algorithm of its own. ``auto`` is derived from what is registered: a checkpoint's drafter
kind picks the algorithm registered for that kind, no drafter picks the preferred weight-free
algorithm (highest ``auto_priority``, then name).

``create(target, options)`` returns a Speculator or a ``Decline`` with a stable code and an
operator-facing sentence. Codes, in the order they are checked:

* ``refused``        the target refuses speculation outright (outranks everything)
* ``unknown_algorithm`` the name is not registered (the sentence lists the known ones)
* ``no_draft_head``  the algorithm needs trained drafter weights the target does not carry
                     (the sentence names the weight-free algorithms that are installed)
* ``unprofitable``   the trunk cannot verify profitably without its own drafter
* ``cannot_serve``   the factory declined (None or SpeculatorDeclined), with its reason
* ``plugin_error``   the factory raised anything else, or made something that breaks the
                     contract (a missing ``name``/``propose``, an optional member of the wrong
                     type: ``tsspec.capabilities``)

The registry reads what it made through ``tsspec.capabilities`` and sets its gate
(``min_draft_prob``: the operator's ``--spec-pmin``, else the speculator's own default).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable

import attrs

from ..capabilities import ContractError, apply_gate, check_speculator_class, speculator_info, target_info
from ..protocols import DraftHeadKind, SpeculatorDeclined

log = logging.getLogger("tsspec.registry")

AUTO = "auto"

REFUSED = "refused"
UNPROFITABLE = "unprofitable"
NO_DRAFT_HEAD = "no_draft_head"
UNKNOWN_ALGORITHM = "unknown_algorithm"
CANNOT_SERVE = "cannot_serve"
PLUGIN_ERROR = "plugin_error"
DECLINE_CODES = (REFUSED, UNPROFITABLE, NO_DRAFT_HEAD, UNKNOWN_ALGORITHM, CANNOT_SERVE, PLUGIN_ERROR)


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
    """One registration: the algorithm's facts, with the plugin that made it."""

    name: str
    factory: Callable[[Any, Any], Any]
    requires_draft_head: bool
    description: str = ""
    plugin: str | None = None
    package: str | None = None
    version: str | None = None
    # what to attach, for the no_draft_head sentence ("a Medusa GGUF with --spec-draft-model PATH")
    drafter_hint: str = ""
    serves_kind: DraftHeadKind | None = None  # `auto` picks it for targets carrying this kind
    weight_free: bool = False  # serves any target that verifies on its own (no drafter weights)
    auto_priority: int = 0  # among weight-free algorithms, `auto` prefers the highest
    composes_auto: bool = False  # factory(target, options, members, memory) composes auto's pair

    def to_json(self) -> dict[str, Any]:
        """The fields ``tsspec list-speculators --json`` prints for a registration."""
        return {k: getattr(self, k) for k in ("name", "plugin", "package", "version", "requires_draft_head", "description")}


def check_registration(name: Any, factory: Any, *, serves_kind: Any = None, **_: Any) -> None:
    """Raise on arguments no registration may have (the plugin's hook fails, not the run). A
    speculator class registered as its own factory has its members checked here too."""
    if not isinstance(name, str) or not name or name == AUTO:
        raise ValueError(f"invalid speculator name {name!r} ('auto' is reserved)")
    if not callable(factory):
        raise TypeError(f"speculator {name!r}: factory is not callable")
    if serves_kind is not None and not isinstance(serves_kind, DraftHeadKind):
        raise TypeError(f"speculator {name!r}: serves_kind must be a DraftHeadKind or None")
    if isinstance(factory, type):
        check_speculator_class(factory, f"speculator {name!r}")


def draft_head_kind(target: Any) -> DraftHeadKind:
    return target_info(target).drafter.kind


class SpeculatorRegistry:
    """Name -> registration. Fill it with ``register`` (directly or through the plugin hook)."""

    def __init__(self) -> None:
        self._entries: dict[str, SpeculatorEntry] = {}
        self._memory: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {key: dict}
        self.conflicts: list[str] = []  # duplicate names, kept for the CLI to print

    def register(
        self,
        name: str,
        factory: Callable[[Any, Any], Any],
        *,
        requires_draft_head: bool,
        serves_kind: DraftHeadKind | None = None,
        weight_free: bool | None = None,
        description: str = "",
        drafter_hint: str = "",
        auto_priority: int = 0,
        composes_auto: bool = False,
        plugin: str | None = None,
        package: str | None = None,
        version: str | None = None,
    ) -> None:
        """``weight_free`` defaults to ``not requires_draft_head``."""
        check_registration(name, factory, serves_kind=serves_kind)
        if name in self._entries:
            first = self._entries[name].plugin
            self.conflicts.append(f"{name}: registered by {first} and again by {plugin}; kept {first}")
            log.warning("speculator %s registered twice (%s, %s): keeping the first", name, first, plugin)
            return
        self._entries[name] = SpeculatorEntry(
            name, factory, bool(requires_draft_head), str(description or ""), plugin, package, version,
            str(drafter_hint or ""), serves_kind,
            (not requires_draft_head) if weight_free is None else bool(weight_free),
            int(auto_priority), bool(composes_auto),
        )

    def memory(self, target: Any, key: str) -> dict | None:
        """A dict kept per (target, key) for as long as the target lives: what the cost
        governors of one algorithm carry from one sequence to the next on that target (None for
        a target that cannot be weakly referenced)."""
        try:
            return self._memory.setdefault(target, {}).setdefault(key, {})
        except TypeError:
            return None

    def forget(self, target: Any) -> None:
        """Drop everything carried between sequences on ``target``: its next sequence starts as
        a fresh process's first would (the bench measures each run so)."""
        try:
            self._memory.pop(target, None)
        except TypeError:
            pass

    def carries_parks(self, name: str | None) -> bool:
        """Whether a lost park of ``name`` carries to the next sequence: for algorithms with
        drafter weights, whose gain is the drafter's on this machine; not for weight-free ones,
        whose gain is the prompt's (a lookup that lost on chat may win on the next, grounded
        request)."""
        entry = self._entries.get(name) if name else None
        return entry is not None and not entry.weight_free

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[SpeculatorEntry]:
        return [self._entries[n] for n in self.names()]

    def get(self, name: str) -> SpeculatorEntry | None:
        return self._entries.get(name)

    def weight_free(self) -> list[str]:
        """The installed weight-free algorithms, `auto`'s preference first."""
        found = [e for e in self._entries.values() if e.weight_free]
        return [e.name for e in sorted(found, key=lambda e: (-e.auto_priority, e.name))]

    def for_kind(self, kind: DraftHeadKind) -> str | None:
        """The algorithm registered to serve drafters of ``kind`` (first by name), or None."""
        names = [e.name for e in self.entries() if e.serves_kind is kind]
        return names[0] if names else None

    def _weight_free_advice(self) -> str:
        """The end of a no_draft_head sentence: the weight-free algorithms actually installed."""
        free = self.weight_free()
        if not free:
            return " (no weight-free algorithm is installed)"
        return " or use the weight-free " + " or ".join(f"--spec-type {n}" for n in free)

    def resolve_name(self, target: Any, spec_type: str) -> str | Decline:
        """Map ``auto`` to the algorithm for the drafter the checkpoint carries, else to the
        preferred weight-free algorithm."""
        if spec_type != AUTO:
            return spec_type
        kind = draft_head_kind(target)
        if kind is not DraftHeadKind.NONE:
            chosen = self.for_kind(kind)
            if chosen is not None:
                return chosen
        free = self.weight_free()
        if target_info(target).speculation_profitable and free:
            return free[0]
        carried = "a drafter no installed algorithm serves" if kind is not DraftHeadKind.NONE else "no drafter"
        return Decline(
            AUTO,
            NO_DRAFT_HEAD,
            f"auto: the model carries {carried}; attach one (--draft-model) or "
            + (f"choose a weight-free algorithm ({', '.join('--spec-type ' + n for n in free)})"
               if free else "install a weight-free algorithm plugin (none is installed)"),
        )

    def check(self, target: Any, name: str, options: Any = None) -> Decline | None:
        """The declines that need no factory call (cheap: a planner can explain up front)."""
        info = target_info(target)
        if info.speculation_refusal:
            return Decline(name, REFUSED, f"the model refuses speculation: {info.speculation_refusal}")
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join([AUTO, *self.names()]) or AUTO
            return Decline(name, UNKNOWN_ALGORITHM, f"unknown algorithm {name!r}; known: {known}")
        drafter_file = getattr(options, "drafter_path", None)
        if entry.requires_draft_head and draft_head_kind(target) is DraftHeadKind.NONE and not drafter_file:
            return Decline(
                name,
                NO_DRAFT_HEAD,
                f"{name} needs trained drafter weights and the model carries none"
                f"{f' ({info.draft_head_absence})' if info.draft_head_absence else ''}; attach "
                f"{entry.drafter_hint or 'a drafter file'}{self._weight_free_advice()}",
            )
        if not entry.requires_draft_head and not info.speculation_profitable:
            return Decline(
                name,
                UNPROFITABLE,
                f"{name}: this model's verify shares a kernel with its own drafter and is not "
                "profitable without it; load its drafter",
            )
        return None

    def create(self, target: Any, options: Any) -> Any:
        """A ready speculator for ``target``, or a Decline saying why not.

        Under ``auto``, a drafter that asks to back up the weight-free choice (its head says
        ``auto_fallback``) is paired with it: by the registered ``composes_auto`` algorithm
        (members {name: speculator}, weight-free first), else ``pairing.SpeculatorPair``."""
        made = self._create_one(target, options)
        if isinstance(made, Decline) or getattr(options, "spec_type", AUTO) != AUTO:
            return made
        free = self._pair_primary(target, made.name)
        if free is None:
            return made
        primary = self._create_one(target, attrs.evolve(options, spec_type=free))
        if isinstance(primary, Decline):
            return made  # the weight-free algorithm cannot serve: the drafter alone
        from .pairing import SpeculatorPair

        composer = next((e for e in self.entries() if e.composes_auto), None)
        try:  # a composer that fails leaves the fixed pair, logged
            compose = composer.factory if composer else lambda t, o, members, memory: SpeculatorPair(*members.values())
            return compose(target, options, {free: primary, made.name: made}, self.memory(target, AUTO))
        except Exception as exc:
            log.warning("auto's composer %s failed, the pair serves: %r", composer.name, exc)
            return SpeculatorPair(primary, made)

    def _pair_primary(self, target: Any, chosen: str | None) -> str | None:
        """The weight-free algorithm ``auto`` puts in front of ``chosen`` (the drafter's
        algorithm) when the target's head says ``auto_fallback``; None: ``chosen`` runs alone."""
        free = self.weight_free()
        if not target_info(target).drafter.auto_fallback or not free or free[0] == chosen:
            return None
        return free[0]

    def auto_plan(self, target: Any) -> str | Decline:
        """What ``auto`` runs on ``target``, in words: an algorithm's name, ``primary+backup``
        for a pair, or the Decline (no factory is called)."""
        name = self.resolve_name(target, AUTO)
        if isinstance(name, Decline):
            return name
        primary, composer = self._pair_primary(target, name), [e.name for e in self.entries() if e.composes_auto]
        return name if primary is None else f"{composer[0]}({primary}+{name})" if composer else f"{primary}+{name}"

    def _create_one(self, target: Any, options: Any) -> Any:
        name = self.resolve_name(target, getattr(options, "spec_type", AUTO))
        if isinstance(name, Decline):
            refusal = target_info(target).speculation_refusal
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
        try:  # name and propose are required; every other member has its default (capabilities)
            apply_gate(speculator, speculator_info(speculator), getattr(options, "pmin", None))
            what = None
        except ContractError as exc:
            what = str(exc)
        if what is not None:
            log.warning("speculator factory %s (plugin %s) returned %s: %s", name, entry.plugin,
                        type(speculator).__name__, what)
            return Decline(
                name, PLUGIN_ERROR,
                f"{name} (plugin {entry.plugin}) failed: its factory returned a "
                f"{type(speculator).__name__}, not a speculator ({what})",
            )
        return speculator


    def evaluate(self, target: Any, options: Any) -> list[dict[str, Any]]:
        """One row per registered algorithm (``SpeculatorEntry.to_json`` plus ``status``,
        ``code``, ``reason``); with a target, whether it would serve it ('serves') or why not
        ('declined'). Speculators made to find out are closed again."""
        rows = []
        for entry in self.entries():
            row = {**entry.to_json(), "status": "registered", "code": None, "reason": None}
            if target is not None:
                made = self.create(target, attrs.evolve(options, spec_type=entry.name))
                if isinstance(made, Decline):
                    row.update(status="declined", code=made.code, reason=made.reason)
                else:
                    row.update(status="serves")
                    try:
                        speculator_info(made).close()
                    except Exception:
                        pass
            rows.append(row)
        return rows
