"""Shared fixtures for the cross-package tests (defined once, in ``tsspec.testing_fixtures``)."""

from tsspec.testing_fixtures import _one_torch_thread, cli_state  # noqa: F401
