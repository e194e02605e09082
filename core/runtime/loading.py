"""Loading models and drafter files through the model registry (the plugins' loaders).

``load_model(path)`` reads the GGUF's ``general.architecture`` and hands the file to the plugin
that registered that architecture; a drafter file (``--draft-model``) is attached to the loaded
target by the plugin that registered the drafter's architecture. A path that is not a file but
names a file-less architecture (``toy`` or ``toy:SEED``, registered with ``file_less=True``) goes
to that loader as is. Every failure is a ``ModelLoadError`` naming the file and the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from ..errors import ModelLoadError, TsspecError
from .options import SpeculationOptions

@attrs.frozen
class LoadOptions:
    """What a model loader or drafter attach function receives as ``options``."""

    device: str = "cpu"
    dtype: str | None = None  # None: the plugin's default (float32 on CPU)
    speculation: SpeculationOptions = attrs.field(factory=SpeculationOptions)
    # the registered kernels available for ``device``'s type: {op name: implementation}
    kernels: dict = attrs.field(factory=dict)
    # drafter architecture -> the registered attach entry (what attach_drafter_from dispatches
    # to); None: the default catalog's
    drafters: dict | None = attrs.field(default=None, repr=False, eq=False)

    def attach_drafter_from(self, target, architecture: str, source: object):
        """Attach a drafter of ``architecture`` from ``source`` (a file path, or an open reader
        with ``GGUFFile``'s reading methods: a drafter carried inside the target's own file)
        through whichever plugin registered that drafter architecture: a model plugin's public
        way to an algorithm plugin's drafter. ModelLoadError when no loaded plugin serves it."""
        where = getattr(source, "path", source)
        table = self.drafters
        if table is None:
            from .defaults import default_catalog

            table = default_catalog().drafters
        entry = table.get(architecture)
        if entry is None:
            served = ", ".join(sorted(table)) or "none"
            raise ModelLoadError(where, f"carries a {architecture!r} drafter and no loaded plugin attaches "
                                        f"{architecture!r} drafters (served: {served})")
        head = entry.function(target, source, self)
        if head is not None:
            target.draft_head = head
        return head

    # speculation settings read through the load options (drafters need the window, pmin...)
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "speculation":
            raise AttributeError(name)
        return getattr(self.speculation, name)


def _device_type(device: object) -> str:
    """"cuda:1" -> "cuda" (the kernel table is keyed by device type)."""
    return str(device or "cpu").split(":", 1)[0]


def file_architecture(path: object, catalog=None) -> str:
    """The architecture of a model file (through the file toolkit a plugin registered: the
    catalog's, else the installed plugins'), with clear errors for missing or bad files."""
    p = Path(str(path))
    if not p.exists():
        raise ModelLoadError(p, "no such file")
    if p.is_dir():
        raise ModelLoadError(p, "is a directory, not a GGUF file")
    from .defaults import default_catalog

    # a catalog built from chosen plugins without the toolkit reads through the installed one
    toolkit = (catalog if catalog is not None else default_catalog()).toolkit or default_catalog().toolkit
    if toolkit is None:
        raise ModelLoadError(p, "no installed plugin reads model files (install tsspec-gguf)")
    return toolkit.architecture(p)


def file_less_entry(path: object, catalog):
    """The loader entry when ``path`` names a file-less model (``NAME`` or ``NAME:ARGS`` of an
    architecture registered with ``file_less=True``, and no such file exists), else None."""
    entry = catalog.models.get(str(path).partition(":")[0])
    if entry is None or not entry.file_less or Path(str(path)).exists():
        return None
    return entry


def load_model(
    path: object = None,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    draft_model: object | None = None,
    options: SpeculationOptions | None = None,
    catalog=None,
):
    """Load ``path`` (a GGUF file, a model name, ``toy``; None: the default model a plugin
    offers) through the plugin that serves its architecture; attach ``draft_model``."""
    spec = options or SpeculationOptions()
    load_options = LoadOptions(device=device, dtype=dtype, speculation=spec)
    if catalog is None:
        from .defaults import default_catalog

        catalog = default_catalog()
    load_options = attrs.evolve(load_options, kernels=catalog.kernel_table(_device_type(device)),
                                drafters=dict(catalog.drafters))
    if path is None:
        from .named_models import default_model

        path = default_model(catalog)
    entry = file_less_entry(path, catalog)
    if entry is None:
        from .named_models import resolve_model_path

        path = resolve_model_path(path, catalog)
        arch = file_architecture(path, catalog)
        entry = catalog.models.get(arch)
        if entry is None:
            if arch in catalog.drafters:
                raise ModelLoadError(
                    path, f"is a {arch!r} drafter file, not a model; attach it with --draft-model"
                )
            served = ", ".join(sorted(catalog.models)) or "none"
            raise ModelLoadError(
                path, f"architecture {arch!r} is served by no loaded plugin (served: {served})"
            )
    try:
        target = entry.function(str(path), load_options)
    except TsspecError:  # a plugin's own one-line error (ModelLoadError or its own subclass)
        raise
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise ModelLoadError(
            path, f"plugin {entry.plugin} failed to load it: {type(exc).__name__}: {exc}"
        ) from exc
    drafter = draft_model or spec.drafter_path
    if not drafter and spec.enabled and Path(str(path)).is_file():
        from .bundled import pick

        record = pick(catalog.bundled_drafters, path, spec.spec_type)
        if record is not None:
            drafter = record.path  # a drafter a plugin ships for exactly this file
    if drafter:
        attach_drafter(target, drafter, load_options, catalog)
    return target


def attach_drafter(target, path: object, load_options: LoadOptions, catalog=None):
    """Attach a separate drafter file; its general.architecture decides what it is."""
    if catalog is None:
        from .defaults import default_catalog

        catalog = default_catalog()
    arch = file_architecture(path, catalog)
    entry = catalog.drafters.get(arch)
    if entry is None:
        if arch in catalog.models:
            raise ModelLoadError(path, f"is a {arch!r} model, not a drafter file")
        served = ", ".join(sorted(catalog.drafters)) or "none"
        raise ModelLoadError(path, f"drafter architecture {arch!r} is served by no loaded plugin (served: {served})")
    try:
        head = entry.function(target, str(path), load_options)
    except TsspecError:  # a plugin's own one-line error (ModelLoadError or its own subclass)
        raise
    except Exception as exc:
        raise ModelLoadError(
            path, f"plugin {entry.plugin} failed to attach it: {type(exc).__name__}: {exc}"
        ) from exc
    if head is not None:
        target.draft_head = head
    return head
