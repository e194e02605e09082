"""The pytest fixtures tsspec's suites share (the root conftest.py registers ``_isolated_environ`` for
all; a suite's conftest imports the rest by name). ``_isolated_environ``: a test starts without
``TS_SPEC_*`` / ``TS_MTP_*`` / ``TSSPEC_*`` settings and leaves ``os.environ`` as it found it (the
CLI publishes its flags there). ``_one_torch_thread``: toy-sized tensors on one torch thread."""

from __future__ import annotations

import contextlib
import os

import pytest

SPEC_ENV_PREFIXES = ("TS_SPEC_", "TS_MTP_", "TSSPEC_")


@contextlib.contextmanager
def _environ_restored():
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _isolated_environ():
    with _environ_restored():
        for name in [n for n in os.environ if n.startswith(SPEC_ENV_PREFIXES)]:
            del os.environ[name]
        yield


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def cli_state(monkeypatch):
    """Restore the CLI's state (default catalog, CliState fields, ``os.environ``) after the test."""
    from tsspec.cli.state import STATE
    from tsspec.runtime import defaults

    monkeypatch.setattr(defaults, "_catalog", defaults._catalog)
    for field in ("config_path", "config", "controls", "debug", "catalog"):
        monkeypatch.setattr(STATE, field, getattr(STATE, field))
    with _environ_restored():
        yield STATE
