"""The former name of ``tsspec_gguf.gguf_writer`` (kept so code written against it runs)."""

from .gguf_writer import write_gguf

__all__ = ["write_gguf"]
