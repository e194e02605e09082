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
    """register(name, factory, *, requires_draft_head: bool,
    serves_kind: DraftHeadKind | None = None, weight_free: bool = not requires_draft_head,
    description: str = "", drafter_hint: str = "", auto_priority: int = 0, composes_auto: bool = False);
    factory(target, options) -> Speculator | None (None or SpeculatorDeclined = cannot serve).

    The algorithm's facts travel with its registration: ``serves_kind`` makes ``auto`` pick it
    for targets carrying a drafter of that kind; ``weight_free`` algorithms are what ``auto``
    picks without one (highest ``auto_priority`` first) and what decline sentences suggest.
    ``drafter_hint`` says what to attach when the model carries no drafter ("a Medusa GGUF with
    --spec-draft-model PATH"): it completes the ``no_draft_head`` sentence. ``composes_auto``:
    auto's pair is handed to ``factory(target, options, members, memory)`` (docs/plugins.md)."""


@hookspec
def tsspec_register_models(register):
    """register(architectures: list[str], loader, *, file_less: bool = False);
    loader(gguf_path, options) -> SpeculativeTarget, keyed by the GGUF's general.architecture.
    ``file_less=True``: the loader takes a name instead of a file (``--model toy``, ``toy:SEED``:
    a model path that is not a file and whose part before ``:`` is the architecture)."""


@hookspec
def tsspec_register_named_models(register):
    """register(name: str, resolve, *, description: str = "", installed: bool = True,
    default: bool = False); ``resolve()`` returns the path of the model's GGUF, made from
    installed packages (e.g. assembled once into the tsspec cache; nothing downloads at run time)
    or raises ModelLoadError. ``--model NAME`` loads it when no file of that name exists;
    ``installed`` False lists the name with what to install; ``default`` offers it as the model
    loaded when none is named (the first installed one a plugin offers wins)."""


@hookspec
def tsspec_register_drafters(register):
    """register(architectures: list[str], attach); attach(target, gguf_path, options) -> DraftHead
    for separate drafter files (dflash, ...). ``gguf_path`` may also be an open reader with
    ``GGUFFile``'s reading methods: a drafter carried inside a model's own file, handed over by
    the model plugin through ``LoadOptions.attach_drafter_from`` (no import between them)."""


@hookspec
def tsspec_register_file_toolkit(register):
    """register(architecture, identity, *, kernels_info=None): the model-file toolkit the core
    reads files through, so it names no file format. ``architecture(path) -> str``: a model
    file's architecture (ModelLoadError when unreadable); ``identity(architecture, shape_digest,
    sha256) -> obj`` with ``obj.matches(path) -> bool`` keys a shipped drafter by its target
    file; ``kernels_info() -> dict`` says what the compiled CPU kernels run (``simd``, ``int8``).
    The first plugin to register one wins."""


@hookspec
def tsspec_register_kernels(register):
    """register(op_name: str, implementation, *, device: str = "cuda", description: str = "",
    available: bool = True, reason: str = ""); accelerated implementations of named ops; the
    torch reference stays the fallback. ``available=False`` records an op that cannot run here
    (no device, a missing library) with the reason: listed by ``tsspec plugins``, never used.
    Loaders receive the available ops for their device as ``options.kernels`` ({op: callable})."""


@hookspec
def tsspec_register_converters(register):
    """register(model_types: list[str], converter, *, description: str = "");
    converter(src_dir: pathlib.Path, out_path: pathlib.Path, *, outtype: str) -> None writes a
    GGUF from a Hugging Face checkpoint directory (targets and drafters alike). ``outtype`` is
    "f32", "f16" or "q8_0". ``tsspec convert SRC_DIR OUT.gguf`` looks up config.json's
    ``architectures`` entries (class names), then its ``model_type``, among every registered
    key: register a class name to claim one checkpoint class only. Another plugin may hand a
    checkpoint over by type with ``tsspec.runtime.converting.convert_as(model_type, ...,
    **settings)``: a converter that takes such settings accepts them as keywords."""


@hookspec
def tsspec_register_trainers(register):
    """register(kind: str, trainer, *, description: str = ""); trainer(request, target, log) ->
    dict trains a drafter of ``kind`` (``tsspec train-drafter --kind KIND``; ``request`` is the
    training plugin's own request record)."""


@hookspec
def tsspec_register_switches(register):
    """register(name: str, description: str): an environment switch this plugin reads through
    ``tsspec.switches.switch_on``; ``description`` says what setting it to 0 does. ``tsspec
    --help`` lists every registered switch; the first plugin to register a name keeps it."""


@hookspec
def tsspec_register_commands(app):
    """Add commands to the typer application ``app``."""
