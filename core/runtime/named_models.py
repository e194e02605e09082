"""``--model NAME``: a name a plugin registered, or a model in Ollama's local store (``$OLLAMA_MODELS``,
``~/.ollama/models`` or the service's), resolved to a GGUF path; an existing path stays a path."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ModelLoadError

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY, OLLAMA_NAMESPACE, OLLAMA_TAG = "registry.ollama.ai", "library", "latest"


def ollama_stores() -> list[Path]:
    configured = os.environ.get("OLLAMA_MODELS")
    if configured:
        return [Path(configured).expanduser()]
    return [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def ollama_manifest_path(name: str, store: Path) -> Path | None:
    """Where a name's manifest lives in ``store`` (None for a name Ollama would not accept)."""
    base, _, tag = name.partition(":")
    parts = [p for p in base.split("/") if p]
    if not parts or len(parts) > 3 or any(p in (".", "..") for p in parts) or "/" in tag:
        return None
    registry, namespace = OLLAMA_REGISTRY, OLLAMA_NAMESPACE
    if len(parts) == 3:
        registry, namespace = parts[0], parts[1]
    elif len(parts) == 2:
        namespace = parts[0]
    return store / "manifests" / registry / namespace / parts[-1] / (tag or OLLAMA_TAG)


def ollama_blob(name: str, stores: list[Path] | None = None) -> str | None:
    """The GGUF blob of an Ollama model name, None when no store holds it (ModelLoadError when broken)."""
    for store in stores if stores is not None else ollama_stores():
        manifest = ollama_manifest_path(name, store)
        if manifest is None or not manifest.is_file():
            continue
        try:
            layers = json.loads(manifest.read_text()).get("layers") or []
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelLoadError(name, f"Ollama manifest {manifest} is unreadable: {exc}") from None
        digests = [layer.get("digest", "") for layer in layers if isinstance(layer, dict)
                   and layer.get("mediaType") == OLLAMA_MODEL_LAYER]
        if not digests:
            raise ModelLoadError(name, f"Ollama manifest {manifest} has no model layer")
        blob = store / "blobs" / digests[0].replace(":", "-")
        if not blob.is_file():
            raise ModelLoadError(name, f"Ollama blob {blob} is missing")
        return str(blob)
    return None


def default_model(catalog) -> str:
    """The first installed named model a plugin offers as the default (ModelLoadError when none)."""
    for entry in catalog.named_models.values():
        if entry.default and entry.installed:
            return entry.name
    offered = [e.name for e in catalog.named_models.values() if e.default]
    hint = f" ({', '.join(offered)} offered but not installed)" if offered else ""
    raise ModelLoadError("(default model)", "no installed plugin offers a default model" + hint
                         + "; name a GGUF file or a model (`tsspec models` lists them)")


def resolve_model_path(path: object, catalog) -> object:
    """A model argument as a path: as given when it exists, a named model's file, or an Ollama blob."""
    text = str(path)
    if Path(text).exists():
        return path
    entry = catalog.named_models.get(text)
    if entry is not None:
        return entry.resolve()
    blob = ollama_blob(text) if not text.endswith(".gguf") else None
    return blob if blob is not None else path
