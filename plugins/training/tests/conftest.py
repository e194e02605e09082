"""Fixtures for the training's tests."""

from __future__ import annotations

import os
import textwrap

import pytest


@pytest.fixture(autouse=True)
def _clean_spec_env(monkeypatch):
    """Tests must not see the operator's (or another test's published) TS_* settings."""
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
