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

import attrs
import torch

from tsspec.protocols import ModelConfig

from .hparams import GlmDsaHParams
from .trunk import GlmDsaTrunk
from .weights import GlmDsaWeights

PREFILL_CHUNK = 256  # rows per batched trunk call (float64)
LOSSLESS = {  # what --stats prints on its [lossless] line (docs/lossless.md)
    torch.float32: "bit-exact: every verify row runs alone through the one-row code (greedy and seeded)",
    torch.float64: "equal to plain up to float64 rounding (rows batched; the same key selections)",
}


@attrs.define
class TargetCounters:
    forward_calls: int = 0
    forward_rows: int = 0
    keeps: int = 0  # spec_keep calls that dropped rows


class GlmDsaTarget:
    """A GLM 5.x model behind the ``SpeculativeTarget`` protocol."""

    speculation_profitable = True  # the trunk verifies without a drafter: n-gram serves it
    speculation_refusal = None
    spec_preferred_draft_window = None
    spec_verify_persists_accepted_kv = True

    def __init__(self, hp: GlmDsaHParams, weights: GlmDsaWeights, *, dtype: torch.dtype = torch.float32,
                 tokenizer=None, max_context: int | None = None, source_path: str | None = None):
        self.hp = hp
        self.trunk = GlmDsaTrunk(hp, weights, dtype)
        self.tokenizer = tokenizer
        self.source_path = source_path
        self._max_context = int(max_context or hp.context_length)
        self.config = ModelConfig(
            architecture="glm-dsa", vocab_size=hp.vocab_size, hidden_size=hp.hidden_size,
            num_layers=hp.num_layers, context_length=self._max_context,
            extra={"nextn_layers": hp.nextn_layers, "index_topk": hp.index_topk,
                   "dtype": str(dtype).replace("torch.", ""), "lossless": LOSSLESS.get(dtype, "not stated")},
        )
        self.counters = TargetCounters()
        self._cache = self.trunk.new_cache()
        self._len = 0
        self._last_start = self._last_end = 0
        self.draft_head = None
        self.spec_draft_head_absence: str | None = None

    # -- capability fields ---------------------------------------------------------------------
    @property
    def cache_seq_len(self) -> int:
        return self._len

    @property
    def max_context_length(self) -> int:
        return self._max_context

    @property
    def spec_feature_size(self) -> int:
        return self.hp.hidden_size

    @property
    def cache_bytes(self) -> int:
        return self._cache.nbytes()

    # -- the protocol ---------------------------------------------------------------------------
    def spec_ensure_capacity(self, required_seq_len: int) -> None:
        if required_seq_len > self._max_context:
            raise ValueError(f"{required_seq_len} positions exceed the context of {self._max_context}")
        self._cache.ensure(required_seq_len)

    def spec_forward(self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool):
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("spec_forward needs at least one token")
        bad = [t for t in tokens if not 0 <= t < self.hp.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.hp.vocab_size - 1})")
        start, rows = self._len, len(tokens)
        self.spec_ensure_capacity(start + rows)
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
        self.counters.forward_calls += 1
        self.counters.forward_rows += rows
        self._len = start + rows
        self._last_start, self._last_end = start, start + rows
        return logits, (hidden if want_hidden else None)

    def spec_keep(self, rows_kept: int) -> None:
        """Keep the state after the first ``rows_kept`` rows of the last forward."""
        if not 0 <= rows_kept <= self._last_end - self._last_start:
            raise ValueError(f"cannot keep {rows_kept} rows of a forward of {self._last_end - self._last_start}")
        if self._len != self._last_end:
            raise RuntimeError("spec_keep after the cache was rewound past the last forward")
        if self._last_start + rows_kept < self._len:
            self.counters.keeps += 1
        self._len = self._last_start + rows_kept
        self._last_end = self._len

    def spec_rewind_cache(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot rewind to {length}: the cache holds {self._len}")
        self._len = length
        self._last_start = self._last_end = length
        if length == 0 and self.draft_head is not None:
            self.draft_head.reset()
