"""tsspec: lossless speculative decoding for GGUF language models.

The public surface: the protocols, the registry, the hook markers, and the Python API the CLI
uses (``load_model``, ``generate``). Plugins should import only what is listed in ``__all__``.
Heavy modules (torch) load on first use, so ``import tsspec`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from .cost_shape import parse_cost_shape, rows_cost
from .errors import ConfigError, GenerationError, ModelLoadError, OptionsError, TsspecError
from .hookspecs import hookimpl, hookspec
from .protocols import (
    BatchedSpeculativeTarget,
    DraftContext,
    DraftHead,
    DraftHeadKind,
    HeadCounts,
    ModelConfig,
    PagedKV,
    PagedRows,
    PrecedingTokens,
    Proposal,
    SpecTrunk,
    SpeculativeTarget,
    Speculator,
    SpeculatorDeclined,
    Tokenizer,
    require_feature_width,
    resolve_feature_taps,
)
from .runtime.options import MAX_DRAFT_WINDOW, SpeculationOptions
from .runtime.registry import DECLINE_CODES, Decline, SpeculatorRegistry

__version__ = "0.1.0"

# name -> module that defines it, imported on first access
_LAZY = {
    "load_model": "tsspec.runtime.loading",
    "attach_drafter": "tsspec.runtime.loading",
    "LoadOptions": "tsspec.runtime.loading",
    "generate": "tsspec.runtime.generation",
    "Generation": "tsspec.runtime.generation",
    "SamplingParams": "tsspec.runtime.sampling",
    "Sampler": "tsspec.runtime.sampling",
    "SpecStats": "tsspec.runtime.stats",
    "SpeculativeExecution": "tsspec.runtime.execution",
    "SpeculationCostGovernor": "tsspec.runtime.governor",
    "LinearSpecTrunk": "tsspec.runtime.trunk",
    "BatchedSpecTrunk": "tsspec.runtime.batched_trunk",
    "Scheduler": "tsspec.runtime.scheduler",
    "SequenceRequest": "tsspec.runtime.scheduler",
    "GGUFFile": "tsspec_gguf.gguf_file",
    "PluginHost": "tsspec.plugins",
    "build_catalog": "tsspec.runtime.catalog",
    "PluginControls": "tsspec.plugins",
}

__all__ = [
    "__version__",
    # protocols
    "SpeculativeTarget",
    "BatchedSpeculativeTarget",
    "PagedKV",
    "PagedRows",
    "SpecTrunk",
    "Speculator",
    "DraftHead",
    "DraftHeadKind",
    "DraftContext",
    "HeadCounts",
    "PrecedingTokens",
    "Proposal",
    "ModelConfig",
    "Tokenizer",
    "SpeculatorDeclined",
    "require_feature_width",
    "resolve_feature_taps",
    # a target's cost by rows (spec_verify_row_ms) as a cost shape
    "parse_cost_shape",
    "rows_cost",
    # registry and options
    "SpeculatorRegistry",
    "Decline",
    "DECLINE_CODES",
    "SpeculationOptions",
    "MAX_DRAFT_WINDOW",
    # hook markers
    "hookimpl",
    "hookspec",
    # errors
    "TsspecError",
    "ModelLoadError",
    "OptionsError",
    "ConfigError",
    "GenerationError",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tsspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
