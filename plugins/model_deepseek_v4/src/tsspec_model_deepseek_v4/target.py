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

import torch

from tsspec.protocols import ModelConfig, resolve_feature_taps
from tsspec_gguf.positional_target import PositionalTarget

from .hparams import DeepseekV4HParams
from .invariant import per_row
from .trunk import DeepseekV4Trunk
from .weights import DeepseekV4Weights


PREFILL_CHUNK = 256  # rows per trunk call (attention scores are rows x keys per head)


class DeepseekV4Target(PositionalTarget):
    """A DeepSeek V4 model behind the ``SpeculativeTarget`` protocol (length, rollback and
    counters: ``tsspec_gguf.positional_target``)."""

    def __init__(self, hp: DeepseekV4HParams, weights: DeepseekV4Weights, *, dtype: torch.dtype = torch.float32,
                 tokenizer=None, max_context: int | None = None, with_draft_head: bool = True,
                 source_path: str | None = None):
        self.hp = hp
        self.trunk = DeepseekV4Trunk(hp, weights, dtype)
        self.tokenizer = tokenizer
        self.source_path = source_path
        max_context = int(max_context or hp.context_length)
        self.config = ModelConfig(
            architecture="deepseek4", vocab_size=hp.vocab_size, hidden_size=hp.hidden_size,
            num_layers=hp.num_layers, context_length=max_context,
            extra={
                "compress_ratios": list(hp.compress_ratios),
                "hc_mult": hp.hc_mult,
                "nextn_layers": hp.nextn_layers,
                "dtype": str(dtype).replace("torch.", ""),
            },
        )
        self._start_positions(self.trunk.new_cache(), max_context, hp.vocab_size)
        self._taps: tuple[int, ...] | None = None
        if with_draft_head and weights.mtp is not None:
            from .mtp import MtpHead

            self.draft_head = MtpHead(self.trunk, weights.mtp, self._max_context)

    # -- capability fields ---------------------------------------------------------------------
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
        self._taps = resolve_feature_taps(layers, self.hp.num_layers)

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

    # -- the protocol ---------------------------------------------------------------------------
    def spec_forward(self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool):
        tokens = self._rows_in(tokens)
        start, rows = self._len, len(tokens)
        logit_rows, hidden_rows = [], []
        with torch.no_grad():
            # long prefills go in chunks: each row's keys are bounded by the window and the
            # compressed entries, and the state is by position, so chunks change nothing
            for at in range(0, rows, PREFILL_CHUNK):
                part = tokens[at : at + PREFILL_CHUNK]
                out = self.trunk.forward(part, start + at, self._cache, taps=self._taps or ())
                if all_logits_rows or at + len(part) == rows:
                    logit_rows.append(self.trunk.logits(out.streams if all_logits_rows else out.streams[-1:]))
                if want_hidden:
                    if self._taps:
                        hidden_rows.append(torch.cat([per_row(lambda s: s.mean(dim=1), out.taps[t])
                                                      for t in self._taps], dim=-1))
                    else:
                        hidden_rows.append(out.streams.reshape(len(part), -1))
            logits = torch.cat(logit_rows)
            hidden = torch.cat(hidden_rows) if want_hidden else None
        self._forwarded(rows)
        return logits, hidden
