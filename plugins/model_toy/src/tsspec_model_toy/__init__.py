"""tsspec-model-toy: ``--model toy`` / ``toy:SEED`` loads ``tsspec.testing.ToyTarget``.

Registered through the ``tsspec`` entry point ``toy`` as the file-less architecture ``toy``.
``tsspec_model_toy.heads`` holds the exact toy draft heads the draft-head tests run on.
Importing this module is cheap: the toy (torch) loads with the first model.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

ARCHITECTURE = "toy"

__all__ = ["ARCHITECTURE", "load_toy", "tsspec_register_models"]


def load_toy(name: str, options=None):
    """``toy`` or ``toy:SEED`` -> a ToyTarget with that seed (0 by default)."""
    from tsspec.errors import ModelLoadError
    from tsspec.testing import ToyTarget

    _, _, seed = str(name).partition(":")
    try:
        return ToyTarget(seed=int(seed or 0))
    except ValueError:
        raise ModelLoadError(name, "toy model seed must be an integer (toy:SEED)") from None


@hookimpl
def tsspec_register_models(register):
    register([ARCHITECTURE], load_toy, file_less=True)
