"""tsspec-medusa: Medusa heads as a tsspec speculation algorithm, published as a plugin.

The entry point ``medusa = "tsspec_medusa"`` points at this module; the hook implementations
it re-exports from ``plugin`` are what tsspec calls. Importing it registers nothing by itself.
It uses only tsspec's public API (``import tsspec``).
"""

from .heads import MedusaHeads
from .plugin import TSSPEC_CONTRACT, tsspec_register_commands, tsspec_register_drafters, tsspec_register_speculators
from .speculator import (
    NAME,
    NO_FILE_REASON,
    MedusaSpeculator,
    attach_medusa,
    load_heads,
    make_medusa,
)
from .weights import (
    ARCHITECTURE,
    MedusaFileError,
    MedusaFileInfo,
    heads_from_medusa_state_dict,
    read_medusa,
    read_medusa_info,
    write_medusa,
    write_random_medusa,
)

__all__ = [
    "ARCHITECTURE",
    "TSSPEC_CONTRACT",
    "MedusaFileError",
    "NAME",
    "NO_FILE_REASON",
    "MedusaFileInfo",
    "MedusaHeads",
    "MedusaSpeculator",
    "attach_medusa",
    "heads_from_medusa_state_dict",
    "load_heads",
    "make_medusa",
    "read_medusa",
    "read_medusa_info",
    "tsspec_register_commands",
    "tsspec_register_drafters",
    "tsspec_register_speculators",
    "write_medusa",
    "write_random_medusa",
]
