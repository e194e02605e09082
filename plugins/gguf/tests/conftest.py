"""Fixtures for the toolkit's tests."""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture(autouse=True)
def _clean_spec_env(monkeypatch):
    """Tests must not see the operator's TS_* / TSSPEC_* settings."""
    import os

    for name in list(os.environ):
        if name.startswith(("TS_SPEC_", "TS_MTP_", "TSSPEC_")):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tiny tensors only pay for torch's intra-op thread wake-ups: one thread, restored after."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def scalar_path():
    """A context manager that runs the compiled CPU kernels on their scalar path (tests compare
    it with the SIMD path, which comes back on exit)."""
    from tsspec_gguf import native

    @contextlib.contextmanager
    def scalar():
        native.kernels().set_simd(False)
        try:
            yield
        finally:
            native.kernels().set_simd(True)

    return scalar


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
