"""tsspec bench: paired, alternating measurements against plain decoding and peers."""

from tsspec import hookimpl


@hookimpl
def tsspec_register_commands(app):
    """``tsspec bench``."""
    from .command import bench

    app.command("bench")(bench)
