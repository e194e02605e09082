"""``DeepseekV4Target``: the DeepSeek V4 trunk as a ``SpeculativeTarget``.

Rollback is a change of length. Everything the trunk keeps is stored by absolute position (the
sliding K = V rows, the compressors' raw projections, the emitted compressed entries; see
``attention.py``), and a row only ever reads state of positions at or before its own, so
keeping the first ``n`` rows of the last forward (``spec_keep(n)``) or rewinding to any earlier
length (``spec_rewind_cache``) leaves exactly the state plain decoding would have had. A rewind
into the middle of a compression window drops nothing that is needed: the window's entry is
emitted again, from the stored projections, when its last position is forwarded again.

So the target is a pure-KV target for the loop (``spec_verify_persists_accepted_kv = True``):
no snapshot is taken and nothing is re-forwarded. Hidden rows (``want_hidden``) are the last
layer's hyper-connection streams flattened to ``hc * H`` (what the MTP head reads); with feature
taps set they are, per tapped layer, the mean over the streams ENTERING that layer (DSpark).
"""

from __future__ import annotations

from typing import Sequence

import attrs
import torch

from tsspec.protocols import ModelConfig

from .hparams import DeepseekV4HParams
from .trunk import DeepseekV4Trunk
from .weights import DeepseekV4Weights


@attrs.define
class TargetCounters:
    forward_calls: int = 0
    forward_rows: int = 0
    keeps: int = 0  # spec_keep calls that dropped rows


class DeepseekV4Target:
    """A DeepSeek V4 model behind the ``SpeculativeTarget`` protocol."""

    speculation_profitable = True  # the trunk verifies without a drafter: n-gram serves it
    speculation_refusal = None
    spec_preferred_draft_window = None
    spec_verify_persists_accepted_kv = True

    def __init__(self, hp: DeepseekV4HParams, weights: DeepseekV4Weights, *, dtype: torch.dtype = torch.float32,
                 tokenizer=None, max_context: int | None = None, with_draft_head: bool = True,
                 source_path: str | None = None):
        self.hp = hp
        self.trunk = DeepseekV4Trunk(hp, weights, dtype)
        self.tokenizer = tokenizer
        self.source_path = source_path
        self._max_context = int(max_context or hp.context_length)
        self.config = ModelConfig(
            architecture="deepseek4", vocab_size=hp.vocab_size, hidden_size=hp.hidden_size,
            num_layers=hp.num_layers, context_length=self._max_context,
            extra={
                "compress_ratios": list(hp.compress_ratios),
                "hc_mult": hp.hc_mult,
                "nextn_layers": hp.nextn_layers,
                "dtype": str(dtype).replace("torch.", ""),
            },
        )
        self.counters = TargetCounters()
        self._cache = self.trunk.new_cache()
        self._len = 0
        self._last_start = 0  # the last forward covered positions _last_start .. _last_end - 1
        self._last_end = 0
        self._taps: list[int] | None = None
        self.draft_head = None
        if with_draft_head and weights.mtp is not None:
            from .mtp import MtpHead

            self.draft_head = MtpHead(self.trunk, weights.mtp, self._max_context)

    # -- capability fields ---------------------------------------------------------------------
    @property
    def cache_seq_len(self) -> int:
        return self._len

    @property
    def max_context_length(self) -> int:
        return self._max_context

    @property
    def spec_feature_size(self) -> int:
        if self._taps:
            return len(self._taps) * self.hp.hidden_size
        return self.hp.hc_mult * self.hp.hidden_size

    # -- drafter-facing surface -----------------------------------------------------------------
    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        return self.trunk.embed(list(ids))  # [n, H]

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.trunk.final_norm(h.to(self.trunk.dtype))

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.trunk.lm_head(h.to(self.trunk.dtype))  # [n, V]

    def attach_drafter_file(self, path: str, options=None):
        """Bind a DSpark drafter file (``deepseek4-dspark``, or ``dflash`` with hyper-connections);
        the block plugin's attach hands the latter over here."""
        from .dspark import attach_dspark_file

        return attach_dspark_file(self, path, options)

    def spec_set_feature_taps(self, layers: Sequence[int] | None) -> None:
        if layers:
            bad = [l for l in layers if not 0 <= int(l) <= self.hp.num_layers]
            if bad:
                raise ValueError(f"tap layer {bad[0]} outside 0..{self.hp.num_layers}")
        self._taps = [int(l) for l in layers] if layers else None

    def state_fingerprint(self) -> tuple:
        """(length, then per layer the kept K = V rows and the complete windows' compressed
        entries), rounded to 2^-24 so that summation-order noise of a multi-row forward does
        not count as a difference (a wrong row does)."""
        def q(t: torch.Tensor) -> torch.Tensor:
            return (t.double() * 2.0 ** 24).round()

        parts: list = [self._len]
        for c in self._cache.layers:
            parts.append(q(c.kv[: self._len]))
            if c.compressor is not None:
                parts.append(q(c.compressor.entries[: self._len // c.ratio]))
            if c.indexer is not None:
                parts.append(q(c.indexer.entries[: self._len // c.ratio]))
        return tuple(parts)

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
        with torch.no_grad():
            out = self.trunk.forward(tokens, start, self._cache, taps=self._taps or ())
            streams = out.streams if all_logits_rows else out.streams[-1:]
            logits = self.trunk.logits(streams)
            hidden = None
            if want_hidden:
                if self._taps:
                    hidden = torch.cat([out.taps[t].mean(dim=1) for t in self._taps], dim=-1)
                else:
                    hidden = out.streams.reshape(rows, -1)
        self.counters.forward_calls += 1
        self.counters.forward_rows += rows
        self._len = start + rows
        self._last_start, self._last_end = start, start + rows
        return logits, hidden

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
