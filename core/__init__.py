"""tsspec: lossless speculative decoding for GGUF language models.

``__all__`` is the public surface: the user API and the plugin contract. Everything else is
importable from its module but no promise; heavy modules (torch) load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .capabilities import DrafterInfo, SpeculatorInfo, TargetInfo
from .errors import TsspecError
from .hookspecs import hookimpl
from .protocols import (
    BatchedSpeculativeTarget,
    DraftContext,
    DraftHead,
    DraftHeadKind,
    ModelConfig,
    PagedKV,
    PagedRows,
    Proposal,
    SpeculativeTarget,
    Speculator,
    SpeculatorDeclined,
    Tokenizer,
    require_feature_width,
)
from .runtime.options import SpeculationOptions
from .version import CONTRACT_VERSION

__version__ = CONTRACT_VERSION  # the package and its plugin contract are versioned together

# name -> module that defines it, imported on first access; the last block is importable for
# plugins written against earlier releases and for tests, but not exported
_LAZY = {
    "load_model": "tsspec.runtime.loading",
    "generate": "tsspec.runtime.generation",
    "Generation": "tsspec.runtime.generation",
    "SamplingParams": "tsspec.runtime.sampling",
    # not exported
    "LoadOptions": "tsspec.runtime.loading",
    "attach_drafter": "tsspec.runtime.loading",
    "Sampler": "tsspec.runtime.sampling",
    "SpeculativeExecution": "tsspec.runtime.execution",
    "SpeculationCostGovernor": "tsspec.runtime.governor",
    "PluginHost": "tsspec.plugins",
    "SpeculatorRegistry": "tsspec.runtime.registry",
    "MAX_DRAFT_WINDOW": "tsspec.runtime.options",
    "ContractError": "tsspec.capabilities",
    "SpecTrunk": "tsspec.protocols",
    "HeadCounts": "tsspec.protocols",
    "resolve_feature_taps": "tsspec.protocols",
    "parse_cost_shape": "tsspec.cost_shape",
    "rows_cost": "tsspec.cost_shape",
    "ModelLoadError": "tsspec.errors",
    "OptionsError": "tsspec.errors",
    "ConfigError": "tsspec.errors",
    "GenerationError": "tsspec.errors",
}

__all__ = [
    "__version__",
    "CONTRACT_VERSION",
    # the user API
    "load_model",
    "generate",
    "Generation",
    "SpeculationOptions",
    "SamplingParams",
    "TsspecError",
    # the plugin contract
    "hookimpl",
    "SpeculativeTarget",
    "BatchedSpeculativeTarget",
    "PagedKV",
    "PagedRows",
    "ModelConfig",
    "Tokenizer",
    "DraftHead",
    "DraftHeadKind",
    "Speculator",
    "SpeculatorDeclined",
    "DraftContext",
    "Proposal",
    "SpeculatorInfo",
    "TargetInfo",
    "DrafterInfo",
    "require_feature_width",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tsspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
