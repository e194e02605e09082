"""``tsspec serve``: the OpenAI-compatible server as a command."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from tsspec.cli import flags
from tsspec.cli.state import STATE
from tsspec.errors import OptionsError

COMMAND = "serve"
# [plugin.serve] in tsspec.toml: key -> accepted types
CONFIG = {"draft_memory": (str,), "draft_memory_entries": (int,)}


def draft_memory(target, enabled: bool, path: str | None, entries: int | None):
    """The server's ``PoolStore``: ``path`` from the flag, else ``[plugin.serve] draft_memory``
    (persisted there; none: kept in memory only), loaded now; None when turned off."""
    from tsspec.config import plugin_section

    from .memory import DEFAULT_MAX_ENTRIES, PoolStore

    settings = plugin_section(STATE.config, "serve", CONFIG, source=STATE.config_path or "config")
    if not enabled:
        return None
    entries = entries if entries is not None else settings.get("draft_memory_entries", DEFAULT_MAX_ENTRIES)
    if entries < 16:
        raise OptionsError(f"draft memory entries must be >= 16, got {entries}")
    identity = f"{Path(str(getattr(target, 'path', None) or 'model')).name}:{target.config.vocab_size}"
    store = PoolStore(identity, path or settings.get("draft_memory"), max_entries=entries)
    loaded = store.load()
    if store.warning:
        typer.echo(f"[serve] warning: {store.warning}", err=True)
    elif store.path is not None:
        typer.echo(f"[serve] draft memory {store.path}: {loaded} entries in {len(store.pools)} pool(s)", err=True)
    return store


def serve(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="GGUF file (default: the embedded SmolLM2-135M-Instruct).")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8080,
    served_model_name: Annotated[Optional[str], typer.Option("--served-model-name", help="The model id clients send (default: the file's stem).")] = None,
    kv_cache_mb: Annotated[Optional[float], typer.Option("--kv-cache-mb", help="Memory for the paged KV cache and prefix cache (MiB; default: enough for one request of the model's whole context, at least 256). A smaller cache lowers the context the server advertises.")] = None,
    block_size: Annotated[int, typer.Option("--kv-block-size", help="Tokens per KV block (the prefix cache's unit).")] = 16,
    max_seqs: Annotated[int, typer.Option("--max-seqs", help="Sequences decoded together at most.")] = 8,
    device: flags.Device = "cpu",
    dtype: flags.Dtype = None,
    threads: flags.Threads = None,
    ctx_size: flags.CtxSize = None,
    spec: flags.Spec = None,
    spec_type: flags.SpecType = None,
    spec_draft: flags.SpecDraft = None,
    spec_pmin: flags.SpecPmin = None,
    spec_draft_model: flags.SpecDraftModel = None,
    draft_model: flags.DraftModel = None,
    spec_adaptive: flags.Adaptive = None,
    api_key: Annotated[Optional[List[str]], typer.Option("--api-key", help="Require this key on /v1/ requests (Authorization: Bearer KEY; repeatable).")] = None,
    memory: Annotated[bool, typer.Option("--draft-memory/--no-draft-memory", help="Keep a cross-request n-gram pool per API key for the ngram-pool drafter.")] = True,
    memory_path: Annotated[Optional[str], typer.Option("--draft-memory-path", help="Load the draft memory from this file at start, save it there at shutdown (default: [plugin.serve] draft_memory in tsspec.toml; none: not persisted).")] = None,
    memory_entries: Annotated[Optional[int], typer.Option("--draft-memory-entries", help="Most entries per pool before the oldest, least used are evicted.")] = None,
) -> None:
    """Serve the model over HTTP: OpenAI API (/v1/chat/completions, /v1/completions), /metrics, a chat page at /."""
    from tsspec.cli.generate_cmd import load_target

    for name, value, low in (("--port", port, 0), ("--kv-block-size", block_size, 1), ("--max-seqs", max_seqs, 1)):
        if value < low:
            raise OptionsError(f"{name} must be >= {low}, got {value}")
    if port > 65535:
        raise OptionsError(f"--port must be <= 65535, got {port}")
    keys = [k for k in (api_key or [])]
    if any(not k.strip() for k in keys):
        raise OptionsError("--api-key must not be empty")
    if kv_cache_mb is not None and not kv_cache_mb > 0:
        raise OptionsError(f"--kv-cache-mb must be > 0, got {kv_cache_mb}")
    options = flags.speculation_options(spec, spec_type, spec_draft, spec_pmin, spec_draft_model, draft_model, spec_adaptive)
    if options.enabled:
        flags.check_spec_type(options.spec_type, STATE.catalog.speculators)
    target = load_target(model, device, dtype, options, threads=threads, ctx_size=ctx_size)
    store = draft_memory(target, memory, memory_path, memory_entries)
    import uvicorn

    from tsspec.errors import GenerationError

    from .api import create_app
    from .engine import ServeEngine

    try:
        engine = ServeEngine(
            target, model_id=served_model_name, options=options, registry=STATE.catalog.speculators,
            kv_cache_mb=kv_cache_mb, block_size=block_size, max_seqs=max_seqs, memory=store,
        )
    except ValueError as exc:
        raise GenerationError(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    scheduler = engine.scheduler
    if scheduler.serial is None:
        regime = (f"KV {scheduler.pool.num_blocks} blocks x {block_size} tokens ({engine.kv_cache_mb:g} MiB), "
                  f"context {engine.context} per request, max {max_seqs} sequences")
    else:
        regime = f"one sequence at a time: {scheduler.serial}"
    typer.echo(
        f"[serve] {engine.model_id} on http://{host}:{port}  ({regime}, "
        f"speculation {options.spec_type if options.enabled else 'off'}"
        f"{f', {len(keys)} API key(s)' if keys else ''})",
        err=True,
    )
    engine.start()
    try:
        uvicorn.run(create_app(engine, api_keys=keys), host=host, port=port, log_level="warning")
    finally:
        engine.close()


def register(app: typer.Typer) -> None:
    from .bench import COMMAND as BENCH_COMMAND, bench_serve

    app.command(COMMAND)(serve)
    app.command(BENCH_COMMAND)(bench_serve)
