"""Loading models and drafter files through the plugin that registered the file's architecture
(a file-less name such as ``toy:SEED`` goes to its loader as is). Every failure is a
``ModelLoadError`` naming the file and the problem.
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
        """Attach a drafter of ``architecture`` from ``source`` (a path, or an open reader of the
        target's own file) through the plugin that registered it (ModelLoadError if none)."""
        where = getattr(source, "path", source)
        table = self.drafters if self.drafters is not None else _catalog(None).drafters
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


def _catalog(catalog):
    from .defaults import default_catalog

    return catalog if catalog is not None else default_catalog()


def _device_type(device: object) -> str:
    """"cuda:1" -> "cuda" (the kernel table is keyed by device type)."""
    return str(device or "cpu").split(":", 1)[0]


def file_architecture(path: object, catalog=None) -> str:
    """The architecture of a model file, read by the file toolkit a plugin registered."""
    p = Path(str(path))
    if not p.exists():
        raise ModelLoadError(p, "no such file")
    if p.is_dir():
        raise ModelLoadError(p, "is a directory, not a GGUF file")
    # a catalog built from chosen plugins without the toolkit reads through the installed one
    toolkit = _catalog(catalog).toolkit or _catalog(None).toolkit
    if toolkit is None:
        raise ModelLoadError(p, "no installed plugin reads model files (install tsspec-gguf)")
    return toolkit.architecture(p)


def file_less_entry(path: object, catalog):
    """The loader entry when ``path`` names a file-less model (``NAME[:ARGS]``), else None."""
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
    """Load ``path`` (a file, a model name, ``toy``; None: the default model); attach ``draft_model``."""
    spec = options or SpeculationOptions()
    load_options = LoadOptions(device=device, dtype=dtype, speculation=spec)
    catalog = _catalog(catalog)
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
    catalog = _catalog(catalog)
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
