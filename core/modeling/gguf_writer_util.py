"""The former name of ``tsspec.modeling.gguf_writer`` (kept so code written against it runs)."""

from .gguf_writer import write_gguf

__all__ = ["write_gguf"]
