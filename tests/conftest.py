"""Shared fixtures for the cross-package tests (defined once, in ``tsspec.testing_fixtures``)."""

from tsspec.testing_fixtures import _clean_spec_env, _one_torch_thread, cli_state  # noqa: F401
