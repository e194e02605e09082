"""``tsspec inspect PATH``: what a GGUF file is and which plugin would serve it."""

from __future__ import annotations

import collections
import json
from typing import Annotated

import typer

from tsspec.cli.state import STATE

SHOWN_KEYS = ("block_count", "embedding_length", "context_length", "attention.head_count",
              "attention.head_count_kv", "feed_forward_length", "vocab_size", "rope.freq_base",
              "nextn_predict_layers", "expert_count", "block_size", "target_layers")


def describe(path: str, catalog) -> dict:
    from tsspec_gguf.gguf_file import GGUFFile
    from tsspec_gguf.qlinear import weight_format

    with GGUFFile(path) as gf:
        arch = gf.architecture
        types = collections.Counter(gf.tensor_info(n).ggml_type.name for n in gf.tensor_names)
        keys = {k: gf.get(f"{arch}.{k}") for k in SHOWN_KEYS if f"{arch}.{k}" in gf}
        nextn = int(gf.get(f"{arch}.nextn_predict_layers", 0) or 0)
        info = {
            "path": path,
            "architecture": arch,
            "name": gf.get("general.name", None),
            "gguf_version": gf.version,
            "metadata_keys": len(gf.keys),
            "key_metadata": keys,
            "tensor_count": len(gf.tensor_names),
            "tensor_types": dict(types.most_common()),
            "weight_formats": {t: weight_format(t) for t, _ in types.most_common()},
            "has_tokenizer": "tokenizer.ggml.tokens" in gf,
            "has_chat_template": "tokenizer.chat_template" in gf,
        }
    if arch in catalog.drafters:
        entry = catalog.drafters[arch]
        info["kind"] = "drafter"
        info["carries_drafter"] = True
        info["served_by"] = entry.plugin
        info["reason"] = f"a drafter file: attach it with --draft-model (plugin {entry.plugin})"
    elif arch in catalog.models:
        entry = catalog.models[arch]
        info["kind"] = "model"
        info["carries_drafter"] = nextn > 0
        info["drafter"] = f"MTP/NextN head ({nextn} layer)" if nextn else None
        info["served_by"] = entry.plugin
        info["reason"] = None
    else:
        info["kind"] = "unserved"  # neither a model nor a drafter any installed plugin knows
        info["carries_drafter"] = nextn > 0
        info["served_by"] = None
        served = ", ".join(sorted(catalog.models)) or "none"
        info["reason"] = f"no loaded plugin serves architecture {arch!r} (served: {served})"
    return info


def inspect(
    path: Annotated[str, typer.Argument(help="A GGUF file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a GGUF's architecture, key metadata, tensors, drafter, and which plugin serves it."""
    from tsspec.runtime.loading import file_architecture

    file_architecture(path)  # clear errors for missing / non-GGUF files
    info = describe(path, STATE.catalog)
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    typer.echo(f"{info['path']}: {info['architecture']} {info['kind']}" + (f" ({info['name']})" if info["name"] else ""))
    for k, v in info["key_metadata"].items():
        typer.echo(f"  {k:<26} {v}")
    types = ", ".join(f"{t} x{n}" for t, n in info["tensor_types"].items())
    typer.echo(f"  tensors: {info['tensor_count']} ({types})")
    forms = ", ".join(f"{t} {form}" for t, form in info["weight_formats"].items())
    typer.echo(f"  weight formats (CPU): {forms}")
    typer.echo(f"  tokenizer: {'yes' if info['has_tokenizer'] else 'no'}, chat template: {'yes' if info['has_chat_template'] else 'no'}")
    typer.echo(f"  carries a drafter: {'yes' if info['carries_drafter'] else 'no'}")
    if info["served_by"]:
        typer.echo(f"  served by plugin: {info['served_by']}")
    if info["reason"]:
        typer.echo(f"  {info['reason']}")
