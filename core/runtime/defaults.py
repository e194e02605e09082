"""The process-wide default plugin host and catalog, built on first use (the CLI's ``configure``)."""

from __future__ import annotations

from ..plugins import PluginControls, PluginHost
from .catalog import Catalog, build_catalog

_catalog: Catalog | None = None


def configure(controls: PluginControls | None = None) -> Catalog:
    """Build (or rebuild) the default catalog with the given operator controls."""
    global _catalog
    _catalog = build_catalog(PluginHost(controls))
    return _catalog


def default_catalog() -> Catalog:
    """The default catalog; built from every installed plugin on first use."""
    if _catalog is None:
        import os

        return configure(PluginControls.resolve(env=os.environ))
    return _catalog
