"""tsspec plugin ``serve``: ``tsspec serve``, an OpenAI-compatible HTTP server.

Many requests share the model through the scheduler (scheduler.py: requests, streaming and
cancellation on the core's batched driver; continuous batching over the
target's paged KV, a block-hash prefix cache), each with its own speculator. Endpoints:
``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus) and a chat page at ``/``.

Importing this package is cheap: FastAPI and the model code load when the command runs.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl


@hookimpl
def tsspec_register_speculators(register):
    from .pool_speculator import DESCRIPTION, NAME, make_pool_speculator

    # below ngram for `auto`: without the server's pool it is a per-request n-gram drafter; the
    # server picks it under `auto` when its draft memory is on (engine.py)
    register(NAME, make_pool_speculator, requires_draft_head=False, weight_free=True, auto_priority=50,
             description=DESCRIPTION)


@hookimpl
def tsspec_register_commands(app):
    from .cli import register

    register(app)
