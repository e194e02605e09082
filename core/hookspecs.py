"""The hooks a tsspec plugin may implement. Every hook takes a ``register`` callback so the core
records which plugin registered what (names, failures and declines are all printable records).

Hooks run once at start-up; the per-token path goes through the protocols, never ``pm.hook``.
Signatures only ever grow; an implementation may accept fewer arguments.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("tsspec")
hookimpl = pluggy.HookimplMarker("tsspec")


@hookspec
def tsspec_register_speculators(register):
    """register(name, factory, *, requires_draft_head: bool, description: str = "",
    drafter_hint: str = ""); factory(target, options) -> Speculator | None (None or
    SpeculatorDeclined = cannot serve). ``drafter_hint`` says what to attach when the model
    carries no drafter ("a Medusa GGUF with --spec-draft-model PATH"): it completes the
    ``no_draft_head`` sentence "<name> needs trained drafter weights ...; attach <hint> or ..."."""


@hookspec
def tsspec_register_models(register):
    """register(architectures: list[str], loader); loader(gguf_path, options) -> SpeculativeTarget,
    keyed by the GGUF's general.architecture."""


@hookspec
def tsspec_register_drafters(register):
    """register(architectures: list[str], attach); attach(target, gguf_path, options) -> DraftHead
    for separate drafter files (dflash, ...)."""


@hookspec
def tsspec_register_kernels(register):
    """register(op_name: str, implementation, *, device: str = "cuda", description: str = "");
    accelerated implementations of named ops; the torch reference stays the fallback."""


@hookspec
def tsspec_register_trainers(register):
    """register(kind: str, trainer, *, description: str = ""); trainer(request, target, log) ->
    dict trains a drafter of ``kind`` (``tsspec train-drafter --kind KIND``; see
    ``tsspec.training.request``)."""


@hookspec
def tsspec_register_commands(app):
    """Add commands to the typer application ``app``."""
