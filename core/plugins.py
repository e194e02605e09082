"""The plugin manager: entry-point discovery, operator allow/deny control, load records.

Every plugin loads through the ``tsspec`` entry-point group; one that fails to import, needs a
newer contract (``TSSPEC_CONTRACT``) or whose hook raises is recorded ``failed`` and skipped.
Control, strongest first: ``--plugins`` / ``--disable-plugin``, ``TSSPEC_PLUGINS`` /
``TSSPEC_DISABLE_PLUGINS``, the config's ``[plugins]``."""

from __future__ import annotations

import importlib.metadata as metadata
import logging
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs
import pluggy

from . import hookspecs
from .version import incompatibility

log = logging.getLogger("tsspec.plugins")

ENTRY_POINT_GROUP = "tsspec"
# every hook hookspecs.py declares, in its order (derived: a new hook cannot be left off)
HOOK_NAMES = tuple(
    name for name, value in vars(hookspecs).items()
    if callable(value) and hasattr(value, hookspecs.hookspec.project_name + "_spec")
)

LOADED, DISABLED, BLOCKED, FAILED = "loaded", "disabled", "blocked", "failed"


@attrs.define
class PluginRecord:
    """What happened to one plugin; ``tsspec plugins --json`` prints these."""

    name: str
    package: str | None = None
    version: str | None = None
    hooks: list[str] = attrs.field(factory=list)
    status: str = LOADED
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


@attrs.frozen
class PluginControls:
    """The operator's resolved allow-list (None = every installed plugin) and deny-list."""

    enabled: frozenset[str] | None = None
    disabled: frozenset[str] = frozenset()
    enabled_source: str = ""  # which control set the allow-list, for the record's reason

    @classmethod
    def resolve(
        cls,
        cli_plugins: str | Sequence[str] | None = None,
        cli_disable: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> "PluginControls":
        env = env or {}
        config = config or {}
        enabled: frozenset[str] | None = None
        source = ""
        if cli_plugins is not None:
            names = _split(cli_plugins) if isinstance(cli_plugins, str) else list(cli_plugins)
            enabled, source = frozenset(names), "--plugins"
        elif "TSSPEC_PLUGINS" in env:
            enabled, source = frozenset(_split(env["TSSPEC_PLUGINS"])), "TSSPEC_PLUGINS"
        elif config.get("enabled") is not None:
            enabled, source = frozenset(config["enabled"]), "config [plugins] enabled"
        disabled = set(config.get("disabled") or ())
        disabled.update(_split(env.get("TSSPEC_DISABLE_PLUGINS", "")))
        for item in cli_disable:
            disabled.update(_split(item))
        return cls(enabled=enabled, disabled=frozenset(disabled), enabled_source=source)

    def verdict(self, name: str) -> tuple[str, str | None]:
        """(status, reason) for a plugin before it is imported."""
        if name in self.disabled:
            return DISABLED, "disabled by the operator (--disable-plugin, TSSPEC_DISABLE_PLUGINS or config)"
        if self.enabled is not None and name not in self.enabled:
            return BLOCKED, f"not in the allow-list ({self.enabled_source})"
        return LOADED, None


class PluginHost:
    """One pluggy manager plus the records of what each plugin did."""

    def __init__(self, controls: PluginControls | None = None):
        self.controls = controls or PluginControls()
        self.pm = pluggy.PluginManager("tsspec")
        self.pm.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self._entrypoints_loaded = False

    def load_entrypoints(self, entry_points: Iterable[metadata.EntryPoint] | None = None) -> None:
        """Import and register every plugin of the ``tsspec`` group once."""
        if self._entrypoints_loaded and entry_points is None:
            return
        if entry_points is None:
            entry_points = metadata.entry_points(group=ENTRY_POINT_GROUP)
            self._entrypoints_loaded = True
        for ep in sorted(entry_points, key=lambda e: e.name):
            if ep.name in self.records:
                continue
            dist = getattr(ep, "dist", None)
            package = dist.metadata["Name"] if dist is not None else None
            version = dist.version if dist is not None else None
            status, reason = self.controls.verdict(ep.name)
            if status != LOADED:
                self.records[ep.name] = PluginRecord(ep.name, package, version, [], status, reason)
                self.pm.set_blocked(ep.name)
                continue
            try:
                plugin = ep.load()
            except BaseException as exc:  # a broken plugin must not take the process down
                if isinstance(exc, (KeyboardInterrupt, SystemExit)) and not isinstance(exc, SystemExit):
                    raise
                self._fail(ep.name, package, version, f"import failed: {_describe(exc)}")
                continue
            self.register(plugin, ep.name, package=package, version=version)

    def register(
        self, plugin: object, name: str, *, package: str | None = None, version: str | None = None
    ) -> PluginRecord:
        """Register an in-process plugin (a module or object with hookimpls) under ``name``."""
        status, reason = self.controls.verdict(name)
        if status != LOADED:
            record = PluginRecord(name, package, version, [], status, reason)
            self.records[name] = record
            return record
        required = getattr(plugin, "TSSPEC_CONTRACT", None)  # the contract version it needs
        problem = incompatibility(required) if required is not None else None
        if problem is not None:
            return self._fail(name, package, version, problem)
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:  # e.g. a hookimpl whose signature matches no hookspec
            return self._fail(name, package, version, f"registration failed: {_describe(exc)}")
        hooks = sorted(
            caller.name for caller in self.pm.get_hookcallers(plugin) or () if caller.name in HOOK_NAMES
        )
        record = PluginRecord(name, package, version, hooks, LOADED, None)
        self.records[name] = record
        return record

    def _fail(self, name, package, version, reason) -> PluginRecord:
        log.warning("plugin %s: %s", name, reason)
        record = PluginRecord(name, package, version, [], FAILED, reason)
        self.records[name] = record
        return record

    def call_each(self, hook_name: str, make_kwargs: Callable[[str], dict[str, Any]]) -> None:
        """Call ``hook_name`` once per loaded plugin that implements it (a pluggy subset call), so one
        plugin raising is recorded against it and the others still run."""
        impls = getattr(self.pm.hook, hook_name).get_hookimpls()
        plain = [impl for impl in impls if not (impl.hookwrapper or impl.wrapper)]
        for impl in plain:
            name = impl.plugin_name
            record = self.records.get(name)
            if record is not None and record.status != LOADED:
                continue
            others = [other.plugin for other in plain if other.plugin_name != name]
            call = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
            try:
                call(**make_kwargs(name))
            except (Exception, SystemExit) as exc:  # SystemExit too, as at import
                reason = f"{hook_name} raised: {_describe(exc)}"
                if record is None:
                    record = self.records[name] = PluginRecord(name)
                record.status, record.reason = FAILED, reason
                log.warning("plugin %s: %s", name, reason)

    def plugin_info(self, name: str) -> PluginRecord:
        return self.records.get(name) or PluginRecord(name)

    def list_records(self) -> list[PluginRecord]:
        return [self.records[k] for k in sorted(self.records)]


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
