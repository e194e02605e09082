"""Fixtures for the training's tests (the shared ones from ``tsspec.testing_fixtures``)."""

from tsspec.testing_fixtures import _one_torch_thread  # noqa: F401
