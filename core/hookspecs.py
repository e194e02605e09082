"""The hooks a tsspec plugin may implement, each with a ``register`` callback (so every
registration is recorded against its plugin). They run once at start-up."""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("tsspec")
hookimpl = pluggy.HookimplMarker("tsspec")


@hookspec
def tsspec_register_speculators(register):
    """register(name, factory, *, requires_draft_head, serves_kind=None, weight_free=None,
    description="", drafter_hint="", auto_priority=0, composes_auto=False); factory(target, options)
    -> Speculator or None / SpeculatorDeclined. ``serves_kind``: ``auto`` picks it for that drafter
    kind; ``weight_free``: ``auto``'s choice without one; ``drafter_hint``: what to attach;
    ``composes_auto``: auto's pair goes to ``factory(target, options, members, memory)``."""


@hookspec
def tsspec_register_models(register):
    """register(architectures, loader, *, file_less=False); loader(gguf_path, options) -> target.
    ``file_less``: the loader takes a name (``--model toy:SEED``)."""


@hookspec
def tsspec_register_named_models(register):
    """register(name, resolve, *, description="", installed=True, default=False); ``resolve()`` ->
    a GGUF path from installed packages (nothing downloads). ``default``: loaded when none is named."""


@hookspec
def tsspec_register_drafters(register):
    """register(architectures, attach); attach(target, gguf_path_or_reader, options) -> DraftHead."""


@hookspec
def tsspec_register_file_toolkit(register):
    """register(architecture, identity, *, kernels_info=None): how the core reads model files
    (``architecture(path)``, ``identity(arch, shape_digest, sha256).matches(path)``). First wins."""


@hookspec
def tsspec_register_kernels(register):
    """register(op_name, implementation, *, device="cuda", description="", available=True,
    reason=""): accelerated ops; loaders get the available ones as ``options.kernels``."""


@hookspec
def tsspec_register_converters(register):
    """register(model_types, converter, *, description=""); converter(src_dir, out_path, *, outtype)
    writes a GGUF from a Hugging Face checkpoint (keyed by class name or ``model_type``)."""


@hookspec
def tsspec_register_trainers(register):
    """register(kind, trainer, *, description=""); trainer(request, target, log) -> dict."""


@hookspec
def tsspec_register_switches(register):
    """register(name, description): an environment switch read through ``tsspec.switches.switch_on``."""


@hookspec
def tsspec_register_commands(app):
    """Add commands to the typer application ``app``."""
