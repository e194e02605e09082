"""The pytest fixtures tsspec's test suites share: a conftest imports them by name
(``from tsspec.testing_fixtures import _clean_spec_env, _one_torch_thread, cli_state``).

``_clean_spec_env`` and ``_one_torch_thread`` are autouse where imported: a test never sees the
operator's (or another test's published) ``TS_SPEC_*`` / ``TS_MTP_*`` / ``TSSPEC_*`` settings, and
toy-sized tensors run on one torch thread (intra-op wake-ups cost more than they give).
"""

from __future__ import annotations

import os

import pytest

__all__ = ["_clean_spec_env", "_one_torch_thread", "cli_state"]


@pytest.fixture(autouse=True)
def _clean_spec_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("TS_SPEC_", "TS_MTP_", "TSSPEC_")):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def cli_state(monkeypatch):
    """Restore the CLI's process state (default catalog, CliState fields) after a test that
    runs ``tsspec.cli.app.main`` in-process."""
    from tsspec.cli.state import STATE
    from tsspec.runtime import defaults

    monkeypatch.setattr(defaults, "_catalog", defaults._catalog)
    for field in ("config_path", "config", "controls", "debug", "catalog"):
        monkeypatch.setattr(STATE, field, getattr(STATE, field))
    return STATE
