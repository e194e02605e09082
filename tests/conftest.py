"""Shared fixtures for the cross-package tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _clean_spec_env(monkeypatch):
    """Tests must not see the operator's (or another test's published) TS_* settings."""
    import os

    for name in list(os.environ):
        if name.startswith(("TS_SPEC_", "TS_MTP_", "TSSPEC_")):
            monkeypatch.delenv(name, raising=False)
