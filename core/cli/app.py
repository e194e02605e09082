"""The ``tsspec`` application: ``main`` reads the global options, loads the plugins (which may
add commands) and runs it. A ``TsspecError`` is one line on stderr and exit code 2.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated, List, Optional

import typer

from .. import __version__
from ..errors import EXIT_USAGE, TsspecError
from . import chat_cmd, convert_cmd, generate_cmd, models_cmd, plugins_cmd
from .state import STATE, CliState


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tsspec {__version__}")
        raise typer.Exit()


def build_app(catalog=None) -> typer.Typer:
    """The CLI shell; ``catalog``'s plugin switches go into ``--help``."""
    from ..switches import describe

    switches = describe(catalog.switch_descriptions()) if catalog is not None else ""
    app = typer.Typer(
        name="tsspec",
        help="Lossless speculative decoding for GGUF language models.",
        epilog=("Attribution switches (environment; output never changes): " + "; ".join(switches.splitlines()))
        if switches else None,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )

    @app.callback()
    def _global(
        version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
        config: Annotated[Optional[str], typer.Option("--config", help="Config file (else $TSSPEC_CONFIG, ./tsspec.toml, user config).")] = None,
        plugins: Annotated[Optional[str], typer.Option("--plugins", help="Allow-list of plugins, comma separated ('' = none).")] = None,
        disable_plugin: Annotated[Optional[List[str]], typer.Option("--disable-plugin", help="Disable a plugin (repeatable).")] = None,
        debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    ) -> None:
        """Global options are read before the command runs (plugins may add commands)."""

    app.command("plugins")(plugins_cmd.plugins)
    app.command("list-speculators")(plugins_cmd.list_speculators)
    app.command("models")(models_cmd.models)
    app.command("generate")(generate_cmd.generate)
    app.command("chat")(chat_cmd.chat)
    app.command("convert")(convert_cmd.convert)
    return app


def _entry_name(entry) -> str | None:
    """The CLI name of a registered typer command (CommandInfo) or group (TyperInfo)."""
    if getattr(entry, "typer_instance", None) is not None:
        return entry.name or entry.typer_instance.info.name
    if entry.name:
        return entry.name
    callback = getattr(entry, "callback", None)
    return callback.__name__.replace("_", "-") if callback is not None else None


def _add_plugin_commands(app: typer.Typer, catalog) -> None:
    """Let each plugin add commands; one reusing a taken name is removed with a warning."""
    log = logging.getLogger("tsspec.cli")
    current: dict = {}

    def settle() -> None:
        if not current:
            return
        for registry, start in ((app.registered_commands, current["commands"]), (app.registered_groups, current["groups"])):
            for entry in list(registry[start:]):
                name = _entry_name(entry)
                if name in current["taken"]:
                    registry.remove(entry)
                    log.warning("plugin %s: command %r is taken; its version was skipped", current["plugin"], name)

    def make_kwargs(plugin: str) -> dict:
        settle()
        current.update(
            plugin=plugin,
            taken={_entry_name(e) for e in (*app.registered_commands, *app.registered_groups)},
            commands=len(app.registered_commands),
            groups=len(app.registered_groups),
        )
        return {"app": app}

    catalog.host.call_each("tsspec_register_commands", make_kwargs)
    settle()


GLOBAL_VALUE_OPTIONS = ("--config", "--plugins", "--disable-plugin")  # global options that take a value


def _command_word(argv: list[str]) -> str | None:
    """The command the operator asked for: the first word that is no global option or its value."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in GLOBAL_VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def check_command_available(app: typer.Typer, argv: list[str], state) -> None:
    """A command missing because its plugin was not loaded is named with that plugin and the reason."""
    word = _command_word(argv)
    if word is None or state.catalog is None:
        return
    if word in {_entry_name(e) for e in (*app.registered_commands, *app.registered_groups)}:
        return
    records = [r for r in state.catalog.host.records.values() if r.status != "loaded"]
    if not records:
        return
    where = f" (config file {state.config_path})" if state.config_path else ""
    same = [r for r in records if r.name == word]
    if same:
        record = same[0]
        raise TsspecError(f"no command {word!r}: the plugin {record.name!r} that adds it is {record.status}: "
                          f"{record.reason}{where}")
    listed = ", ".join(f"{r.name} ({r.status})" for r in sorted(records, key=lambda r: r.name))
    raise TsspecError(f"no command {word!r}; plugins not loaded, one of which may add it: {listed}{where}")


def main(argv: list[str] | None = None) -> None:
    # torch's small ops use OpenMP, whose spinning workers can take the cores from the compiled
    # kernels' own pool: this process asks them to sleep (OMP_WAIT_POLICY=ACTIVE undoes it)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="tsspec: %(message)s")
    try:
        from ..runtime.defaults import configure

        state = CliState.from_argv(argv)
        STATE.__init__(state.config_path, state.config, state.controls, state.debug)
        STATE.catalog = configure(state.controls)
        app = build_app(STATE.catalog)
        _add_plugin_commands(app, STATE.catalog)
        check_command_available(app, argv, STATE)
        app(args=argv, prog_name="tsspec", standalone_mode=True)
    except TsspecError as exc:
        if debug:
            raise
        typer.echo(f"tsspec: error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        typer.echo("tsspec: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
