"""``MemorySource``: the modeling toolkit's in-memory stand-in for a GGUF file
(``tsspec_gguf.gguf_file.MemorySource``), kept under this name for the plugin's tests and
scripts. Keys use full GGUF names (``qwen35.block_count``).
"""

from tsspec_gguf.gguf_file import MEMORY_PATH, MemorySource

__all__ = ["MEMORY_PATH", "MemorySource"]
