"""tsspec plugin ``ray``: tsspec engine replicas under Ray Serve.

The serve plugin's OpenAI app is the ingress (``@serve.ingress``); each replica runs a tsspec
engine; requests are routed by prompt prefix through Ray's ``RequestRouter`` interface so a
conversation stays on the replica that holds its prefix. ``tsspec ray serve --replicas N`` and
``tsspec ray deploy config.yaml``. Importing this package is cheap: Ray loads when a command runs.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl


@hookimpl
def tsspec_register_commands(app):
    from .cli import register

    register(app)
