"""``GlmDsaTarget``: the GLM 5.x trunk as a ``SpeculativeTarget``.

Rollback is a change of length: every layer keeps its compressed KV and indexer keys by absolute
position and a row only reads positions at or before its own (see ``attention.py``), so keeping
the first ``n`` rows of the last forward, or rewinding to any earlier length, leaves exactly the
state plain decoding would have had (``spec_verify_persists_accepted_kv = True``).

float32 (the serving dtype) forwards the rows one at a time through the same code a one-row
decode runs, so a k-row verify reproduces k one-row steps bit for bit; float64 (the exact
reference mode) forwards them batched, and every row still attends only what its one-row decode
would. Hidden rows (``want_hidden``) are the post-final-norm rows the NextN head reads.

When the NextN layer was not loaded, ``spec_draft_head_absence`` says why (absent from the file,
or present and skipped because the load-time request said no): ``list-speculators`` prints it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from tsspec.protocols import ModelConfig
from tsspec_gguf.positional_target import PositionalTarget

from .hparams import GlmDsaHParams
from .trunk import GlmDsaTrunk
from .weights import GlmDsaWeights

PREFILL_CHUNK = 256  # rows per batched trunk call (float64)
LOSSLESS = {  # what --stats prints on its [lossless] line (docs/lossless.md)
    torch.float32: "bit-exact: every verify row runs alone through the one-row code (greedy and seeded)",
    torch.float64: "equal to plain up to float64 rounding (rows batched; the same key selections)",
}


class GlmDsaTarget(PositionalTarget):
    """A GLM 5.x model behind the ``SpeculativeTarget`` protocol (length, rollback and counters:
    ``tsspec_gguf.positional_target``)."""

    def __init__(self, hp: GlmDsaHParams, weights: GlmDsaWeights, *, dtype: torch.dtype = torch.float32,
                 tokenizer=None, max_context: int | None = None, source_path: str | None = None):
        self.hp = hp
        self.trunk = GlmDsaTrunk(hp, weights, dtype)
        self.tokenizer = tokenizer
        self.source_path = source_path
        max_context = int(max_context or hp.context_length)
        self.config = ModelConfig(
            architecture="glm-dsa", vocab_size=hp.vocab_size, hidden_size=hp.hidden_size,
            num_layers=hp.num_layers, context_length=max_context,
            extra={"nextn_layers": hp.nextn_layers, "index_topk": hp.index_topk,
                   "dtype": str(dtype).replace("torch.", ""), "lossless": LOSSLESS.get(dtype, "not stated")},
        )
        self._start_positions(self.trunk.new_cache(), max_context, hp.vocab_size)
        self.spec_draft_head_absence: str | None = None

    # -- capability fields ---------------------------------------------------------------------
    @property
    def spec_feature_size(self) -> int:
        return self.hp.hidden_size

    # -- the protocol ---------------------------------------------------------------------------
    def spec_forward(self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool):
        tokens = self._rows_in(tokens)
        start, rows = self._len, len(tokens)
        step = 1 if self.trunk.dtype == torch.float32 else PREFILL_CHUNK
        parts, logit_rows = [], []
        with torch.no_grad():
            for at in range(0, rows, step):
                part = self.trunk.forward(tokens[at : at + step], start + at, self._cache)  # [step, H]
                parts.append(part)
                if all_logits_rows or at + step >= rows:
                    logit_rows.append(self.trunk.lm_head(part if all_logits_rows else part[-1:]))
            hidden = torch.cat(parts)  # [rows, H]
            logits = torch.cat(logit_rows)
        self._forwarded(rows)
        return logits, (hidden if want_hidden else None)
