"""The catalog: what the loaded plugins registered (speculators, models, drafters, converters,
kernels).

Built from a ``PluginHost`` by calling each registration hook once per plugin, with a
``register`` callback bound to that plugin so every registration is a record with a name,
package and version.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from ..plugins import LOADED, PluginHost
from .converting import ConverterEntry
from .registry import SpeculatorRegistry, check_registration

# the keyword facts a speculator registration may carry besides requires_draft_head
SPECULATOR_FACTS = frozenset("serves_kind weight_free description drafter_hint auto_priority composes_auto".split())


@attrs.define
class LoaderEntry:
    """A model loader or drafter attach function for some GGUF architectures."""

    architectures: list[str]
    function: Callable[..., Any]
    plugin: str | None = None
    package: str | None = None
    version: str | None = None
    file_less: bool = False  # a model loaded by name ("toy", "toy:SEED"), not from a GGUF file


@attrs.define
class NamedModelEntry:
    """A model loadable by name (``--model NAME``): ``resolve()`` -> its GGUF path."""

    name: str
    resolve: Callable[[], str]
    description: str = ""
    installed: bool = True
    plugin: str | None = None
    default: bool = False


@attrs.define
class KernelEntry:
    """One accelerated op. ``available`` False: registered but unusable here (no device, no
    CuPy...), with ``reason``; ``tsspec plugins`` prints it, lookups skip it."""

    op: str
    implementation: Callable[..., Any]
    device: str = "cuda"
    description: str = ""
    plugin: str | None = None
    available: bool = True
    reason: str = ""


@attrs.define
class TrainerEntry:
    """A drafter kind's trainer, as a plugin registered it."""

    kind: str
    trainer: Callable[..., dict]
    description: str = ""
    plugin: str | None = None


@attrs.define
class SwitchEntry:
    """An attribution switch a plugin reads (``TS_...=0`` turns one optimisation off)."""

    name: str
    description: str
    plugin: str | None = None


@attrs.define
class FileToolkit:
    """The model-file toolkit a plugin registered (``tsspec_register_file_toolkit``)."""

    architecture: Callable[[Any], str]
    identity: Callable[..., Any]
    kernels_info: Callable[[], dict] | None = None
    plugin: str | None = None


@attrs.define
class Catalog:
    speculators: SpeculatorRegistry = attrs.field(factory=SpeculatorRegistry)
    models: dict[str, LoaderEntry] = attrs.field(factory=dict)  # architecture -> loader
    named_models: dict[str, NamedModelEntry] = attrs.field(factory=dict)  # name -> resolver
    drafters: dict[str, LoaderEntry] = attrs.field(factory=dict)  # architecture -> attach
    converters: dict[str, ConverterEntry] = attrs.field(factory=dict)  # checkpoint type -> converter
    kernels: dict[str, list[KernelEntry]] = attrs.field(factory=dict)
    trainers: dict[str, Any] = attrs.field(factory=dict)  # drafter kind -> TrainerEntry
    switches: dict[str, SwitchEntry] = attrs.field(factory=dict)  # environment name -> entry
    bundled_drafters: list[Any] = attrs.field(factory=list)  # BundledDrafter records
    toolkit: FileToolkit | None = None  # None: no plugin reads model files
    host: PluginHost | None = None

    def switch_descriptions(self) -> dict[str, str]:
        """Every registered switch -> what setting it to 0 does."""
        return {name: entry.description for name, entry in self.switches.items()}

    def kernel(self, op: str, device: str):
        """The first available implementation of ``op`` for ``device``, or None (use torch)."""
        for entry in self.kernels.get(op, ()):
            if entry.device == device and entry.available:
                return entry.implementation
        return None

    def kernel_table(self, device: str) -> dict[str, Callable[..., Any]]:
        """Every available op for a device type ("cuda", "cpu"): what a loader receives."""
        return {op: impl for op in sorted(self.kernels) if (impl := self.kernel(op, device)) is not None}


def _add_loaders(table: dict[str, LoaderEntry], record, kind: str, pending: list, bundled: list | None = None):
    def register(architectures, function=None, *, file_less=False, files=()):
        if isinstance(architectures, str):
            architectures = [architectures]
        architectures = list(architectures or ())
        if architectures and not callable(function):
            raise TypeError(f"{kind} for {architectures} is not callable")
        if files and bundled is None:
            raise TypeError(f"{kind} registrations take no files")
        records = []
        if files:
            from .bundled import checked_record

            records = [(checked_record(spec), record.name) for spec in files]  # raises when malformed
        entry = (LoaderEntry(architectures, function, record.name, record.package, record.version, bool(file_less))
                 if architectures else None)

        def apply():
            for arch in architectures:
                table.setdefault(arch, entry)  # first registration wins; load order is by name
            if records:
                bundled.extend(records)

        pending.append((record.name, apply))

    return register


def build_catalog(host: PluginHost, *, discover: bool = True) -> Catalog:
    """Load the entry points (once, unless ``discover`` is False: in-process plugins only) and
    collect every plugin's registrations."""
    if discover:
        host.load_entrypoints()
    catalog = Catalog(host=host)
    # Registrations are held per plugin and applied once every hook has run, only for plugins
    # still loaded: a plugin whose hook raised after registering something (or whose later
    # hook raised) is skipped whole, as its "failed" record says. Arguments are checked at
    # the call, so a bad registration fails the hook that made it.
    pending: list[tuple[str, Callable[[], None]]] = []  # (plugin, apply) in registration order

    def speculators_for(name):
        record = host.plugin_info(name)

        def register(spec_name, factory, *, requires_draft_head, **facts):
            unknown = sorted(set(facts) - SPECULATOR_FACTS)
            if unknown:
                raise TypeError(f"register() got unknown keyword arguments {unknown}")
            check_registration(spec_name, factory, **facts)  # raises on bad arguments
            kwargs = dict(facts, requires_draft_head=requires_draft_head, plugin=record.name,
                          package=record.package, version=record.version)
            pending.append((name, lambda: catalog.speculators.register(spec_name, factory, **kwargs)))

        return {"register": register}

    def kernels_for(name):
        def register(op, implementation, *, device="cuda", description="", available=True, reason=""):
            if not isinstance(op, str) or not op:
                raise ValueError(f"invalid kernel op name {op!r}")
            if not callable(implementation):
                raise TypeError(f"kernel {op!r}: implementation is not callable")
            entry = KernelEntry(op, implementation, str(device), description, name, bool(available), str(reason or ""))
            pending.append((name, lambda: catalog.kernels.setdefault(op, []).append(entry)))

        return {"register": register}

    host.call_each("tsspec_register_speculators", speculators_for)
    host.call_each(
        "tsspec_register_models",
        lambda name: {"register": _add_loaders(catalog.models, host.plugin_info(name), "model loader", pending)},
    )
    host.call_each(
        "tsspec_register_drafters",
        lambda name: {"register": _add_loaders(catalog.drafters, host.plugin_info(name), "drafter attach", pending,
                                               catalog.bundled_drafters)},
    )
    def named_models_for(name):
        def register(model_name, resolve, *, description="", installed=True, default=False):
            if not isinstance(model_name, str) or not model_name or "/" in model_name:
                raise ValueError(f"invalid model name {model_name!r}")
            if not callable(resolve):
                raise TypeError(f"named model {model_name!r}: resolve is not callable")
            entry = NamedModelEntry(model_name, resolve, str(description or ""), bool(installed), name,
                                    bool(default))
            pending.append((name, lambda: catalog.named_models.setdefault(model_name, entry)))

        return {"register": register}

    host.call_each("tsspec_register_named_models", named_models_for)

    def converters_for(name):
        record = host.plugin_info(name)

        def register(model_types, converter, *, description=""):
            if isinstance(model_types, str):
                model_types = [model_types]
            model_types = list(model_types)
            if not model_types or not all(isinstance(t, str) and t for t in model_types):
                raise ValueError(f"converter model_types must be non-empty strings, got {model_types!r}")
            if not callable(converter):
                raise TypeError(f"converter for {model_types} is not callable")
            entry = ConverterEntry(model_types, converter, str(description or ""), record.name,
                                   record.package, record.version)

            def apply():
                for model_type in model_types:
                    catalog.converters.setdefault(model_type, entry)  # first registration wins

            pending.append((name, apply))

        return {"register": register}

    host.call_each("tsspec_register_converters", converters_for)
    host.call_each("tsspec_register_kernels", kernels_for)

    def trainers_for(name):
        def register(kind, trainer, *, description=""):
            if not callable(trainer):
                raise TypeError(f"trainer for kind {kind!r} is not callable")
            entry = TrainerEntry(str(kind), trainer, description, name)
            pending.append((name, lambda: catalog.trainers.setdefault(entry.kind, entry)))

        return {"register": register}

    host.call_each("tsspec_register_trainers", trainers_for)

    def switches_for(name):
        def register(switch, description):
            if not isinstance(switch, str) or not switch or not description:
                raise ValueError(f"a switch needs a name and what =0 does, got {switch!r}")
            entry = SwitchEntry(switch, str(description), name)
            pending.append((name, lambda: catalog.switches.setdefault(switch, entry)))

        return {"register": register}

    host.call_each("tsspec_register_switches", switches_for)

    def toolkit_for(name):
        def register(architecture, identity, *, kernels_info=None):
            if not (callable(architecture) and callable(identity)) or not (kernels_info is None or callable(kernels_info)):
                raise TypeError("a file toolkit registers callables: architecture, identity[, kernels_info]")
            toolkit = FileToolkit(architecture, identity, kernels_info, name)
            pending.append((name, lambda: setattr(catalog, "toolkit", catalog.toolkit or toolkit)))

        return {"register": register}

    host.call_each("tsspec_register_file_toolkit", toolkit_for)
    for plugin, apply in pending:
        if host.plugin_info(plugin).status == LOADED:
            apply()
    if catalog.toolkit is not None:  # shipped drafters are keyed by their target file's identity
        from .bundled import bundled_record

        catalog.bundled_drafters[:] = [bundled_record(*r, catalog.toolkit.identity) for r in catalog.bundled_drafters]
    else:
        catalog.bundled_drafters.clear()  # nothing can read a target file to match them
    return catalog
