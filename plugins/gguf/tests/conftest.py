"""Fixtures for the toolkit's tests."""

from __future__ import annotations

import contextlib

import pytest
from tsspec.testing_fixtures import _one_torch_thread, cli_state  # noqa: F401  (shared fixtures)


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


