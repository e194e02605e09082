"""Shared fixtures for the cross-package tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_spec_env(monkeypatch):
    """Tests must not see the operator's (or another test's published) TS_* settings."""
    import os

    for name in list(os.environ):
        if name.startswith(("TS_SPEC_", "TS_MTP_", "TSSPEC_")):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """The toy targets' tiny tensors only pay for torch's intra-op thread wake-ups, which on
    2 busy cores made them ~10x slower. One thread for the cross-package suite, restored after."""
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
