"""``Qwen35Target``: the hybrid trunk as a ``SpeculativeTarget``, with per-row state snapshots.

Rejection on a recurrent trunk : a KV cache drops a rejected tail by
changing its length, a Gated DeltaNet state cannot. ``spec_keep(rows_kept)``, the one rollback
call, has two ways to do it, both kept:

* per-row snapshots (default): a verify (``spec_forward(..., all_logits_rows=True)``) reads the
  live recurrent state and leaves it untouched, emitting the state after EVERY row (one slot per
  row; a slot's conv state is a slice of the window the verify already built). ``spec_keep(m)``
  commits slot ``m - 1`` (the slot buffer and the live buffer swap roles: no copy, no
  re-forward) and sets the length to ``start + m``. Prefill and one-row plain steps commit in
  place. A verify wider than ``MAX_SLOT_ROWS`` rows (slots cost one state per row) takes the
  second way: the contract holds at any width.
* restore + re-forward (``TS_Q35_VERIFY_SNAPSHOTS=0``, or ``per_row_snapshots = False``): a
  verify copies the recurrent state it starts from and advances the live state; ``spec_keep``
  of a prefix restores the copy and re-forwards the kept rows. Kept for attribution (the
  benchmark) and as the fallback.

``spec_verify_persists_accepted_kv`` is False on both paths: rewinding the KV alone never undoes
the recurrent state, so the loop must not reuse a cached prefix by rewinding (a hybrid's rewind
is only legal to the position its recurrent state already holds, and to 0).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import attrs
import torch

from tsspec.protocols import ModelConfig, resolve_feature_taps
from tsspec.switches import switch_on

from .deltanet import DeltaNetSlots
from .hparams import Qwen35HParams
from .mtp import MtpHead
from .trunk import Qwen35Trunk
from .weights import Qwen35Weights

SNAPSHOTS_ENV = "TS_Q35_VERIFY_SNAPSHOTS"
PREFERRED_DRAFT_WINDOW = 3  # each row of a verify costs one recurrent-state slot per GDN layer
MAX_SLOT_ROWS = 16  # wider verifies (or all-row prefills) fall back to copy + re-forward


def snapshots_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``TS_Q35_VERIFY_SNAPSHOTS``: anything but 0/false/no/off keeps per-row snapshots on."""
    return switch_on(SNAPSHOTS_ENV, environ)


@attrs.define
class _PendingVerify:
    """A verify not yet resolved by ``spec_keep``. ``slots`` per GDN layer; or None (restore
    path, or a verify wider than ``MAX_SLOT_ROWS``): it advanced the live state and ``saved``
    holds the state it started from."""

    start: int
    rows: int
    slots: dict[int, DeltaNetSlots] | None
    tokens: list[int] = attrs.field(factory=list)
    saved: dict | None = None


@attrs.define
class TargetCounters:
    """What the rollback machinery did (tests and the benchmark read these)."""

    forward_calls: int = 0
    forward_rows: int = 0
    slot_commits: int = 0  # per-row snapshot commits (one per verify)
    state_snapshots: int = 0  # full copies of the recurrent state (restore path, wide verifies)
    state_restores: int = 0


class Qwen35Target:
    """A Qwen 3.5 / 3.5-MoE / Qwen3-Next model behind the ``SpeculativeTarget`` protocol."""

    speculation_profitable = True  # the trunk verifies without any drafter: n-gram works anywhere
    speculation_refusal = None
    spec_preferred_draft_window = PREFERRED_DRAFT_WINDOW
    spec_verify_persists_accepted_kv = False

    def __init__(self, hp: Qwen35HParams, weights: Qwen35Weights, *, dtype: torch.dtype = torch.float32,
                 tokenizer=None, per_row_snapshots: bool | None = None, max_context: int | None = None,
                 with_draft_head: bool = True, source_path: str | None = None, kernels: dict | None = None):
        self.hp = hp
        self.trunk = Qwen35Trunk(hp, weights, dtype, kernels=kernels)
        self.device = self.trunk.device  # where the trunk runs; logits and hidden rows come back on the CPU
        self.tokenizer = tokenizer
        self.source_path = source_path
        self._max_context = int(max_context or hp.context_length)
        self.config = ModelConfig(
            architecture=hp.architecture, vocab_size=hp.vocab_size, hidden_size=hp.hidden_size,
            num_layers=hp.num_layers, context_length=self._max_context,
            extra={
                "layer_types": ["linear_attention" if r else "full_attention" for r in hp.recurrent],
                "nextn_layers": hp.nextn_layers,
                "v_head_order": hp.v_order,
                "dtype": str(dtype).replace("torch.", ""),
                "lossless": self._guarantee(dtype),
            },
        )
        self._per_row = snapshots_enabled() if per_row_snapshots is None else bool(per_row_snapshots)
        self.counters = TargetCounters()
        self._state = self.trunk.new_state()
        self._len = 0  # positions in the cache (protocol's cache_seq_len)
        self._recurrent_pos = 0  # the position the live recurrent state stands at
        self._pending: _PendingVerify | None = None
        self._last_rows = 0  # rows of the last forward (a committing one keeps them all)
        self._taps: tuple[int, ...] | None = None
        self.draft_head = None
        if with_draft_head and weights.nextn is not None:
            self.draft_head = MtpHead(self.trunk, weights.nextn, self._max_context)

    def _guarantee(self, dtype: torch.dtype) -> str:
        """The lossless guarantee of this path, one line (docs/lossless.md lists every path)."""
        if not isinstance(self.trunk.w.lm_head, torch.Tensor):
            return "bit-exact: row-invariant kernel matmuls and attention (verify rows equal one-row steps)"
        if dtype == torch.float64:
            return "equal to plain up to float64 rounding (verify rows agree to ~1e-15)"
        return (f"not bit-exact: torch's {str(dtype).removeprefix('torch.')} matmuls round verify rows "
                "differently; output equals plain except at a near-tie")

    # -- capability fields -------------------------------------------------------------------
    @property
    def per_row_snapshots(self) -> bool:
        return self._per_row

    @per_row_snapshots.setter
    def per_row_snapshots(self, value: bool) -> None:
        """Switch rollback paths between sequences (an unresolved verify is discarded)."""
        self._drop_pending()
        self._per_row = bool(value)

    @property
    def kernels_in_use(self) -> list[str]:
        """Registered device ops that have run (``generate --stats`` prints them)."""
        return sorted(self.trunk.kernels_used)

    @property
    def cache_seq_len(self) -> int:
        return self._len

    @property
    def max_context_length(self) -> int:
        return self._max_context

    @property
    def spec_feature_size(self) -> int:
        return (len(self._taps) if self._taps else 1) * self.hp.hidden_size

    # -- drafter-facing surface (DFlash / MTP / EAGLE-shaped drafters borrow these) ----------
    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        return self.trunk.embed(list(ids))  # [n, H]

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.trunk.final_norm(h.to(self.device, self.trunk.dtype))

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.trunk.lm_head(h.to(self.device, self.trunk.dtype))  # [n, V]

    def spec_set_feature_taps(self, layers: Sequence[int] | None) -> None:
        self._taps = resolve_feature_taps(layers, self.hp.num_layers)

    # -- the batched paged path (serving; see paged.py) -------------------------------------
    def spec_kv_bytes_per_block(self, block_size: int) -> int:
        from .paged import PagedQwen35KV

        return PagedQwen35KV.bytes_per_block(self, block_size)

    def spec_open_paged(self, num_blocks: int, block_size: int):
        from .paged import open_paged

        return open_paged(self, num_blocks, block_size)

    # -- the protocol ------------------------------------------------------------------------
    def spec_ensure_capacity(self, required_seq_len: int) -> None:
        if required_seq_len > self._max_context:
            raise ValueError(f"{required_seq_len} positions exceed the context of {self._max_context}")
        self._state.ensure(required_seq_len, self._max_context)

    def spec_forward(self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool):
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("spec_forward needs at least one token")
        if self._pending is not None:
            raise RuntimeError("the previous verify was not resolved by spec_keep")
        bad = [t for t in tokens if not 0 <= t < self.hp.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.hp.vocab_size - 1})")
        start, rows = self._len, len(tokens)
        self.spec_ensure_capacity(start + rows)
        verify = all_logits_rows
        slots = verify and self._per_row and rows <= MAX_SLOT_ROWS
        saved = None
        if verify and not slots:  # restore path: keep the state this verify starts from
            saved = self._state.snapshot()
            self.counters.state_snapshots += not self._per_row
        with torch.no_grad():  # not inference_mode: committed slot buffers become live state
            out = self.trunk.forward(tokens, start, self._state, slots=slots, taps=self._taps)
            self.counters.forward_calls += 1
            self.counters.forward_rows += rows
            self._len = start + rows
            self._last_rows = rows
            if verify:
                self._pending = _PendingVerify(start, rows, out.slots, tokens, saved)
            if not slots:
                self._recurrent_pos = start + rows
            need_normed = want_hidden and not self._taps
            last = out.residual if (all_logits_rows or need_normed) else out.residual[-1:]
            normed = self.trunk.final_norm(last)  # [rows or 1, H]
            logits = self.trunk.lm_head(normed if all_logits_rows else normed[-1:])
        hidden = None
        if want_hidden:
            hidden = out.taps if self._taps else normed
        if self.device.type != "cpu":  # the loop samples on the host
            logits = logits.cpu()
            hidden = hidden.cpu() if hidden is not None else None
        return logits, hidden

    def spec_keep(self, rows_kept: int) -> str | None:
        """Keep the first ``rows_kept`` rows of the last forward: commit its slot, or restore
        the saved state and re-forward the kept rows (see the module docstring)."""
        pending = self._pending
        rows = pending.rows if pending is not None else self._last_rows
        if not 1 <= rows_kept <= rows:
            raise ValueError(f"cannot keep {rows_kept} rows of a forward of {rows}")
        if pending is None:  # prefill / plain step: already committed in place
            if rows_kept != rows:
                raise ValueError(
                    f"keeping {rows_kept} of {rows} rows of a committing forward needs a verify "
                    "(spec_forward with all_logits_rows=True)"
                )
            return "committed" if self._per_row else None
        self._pending = None
        if pending.slots is not None:
            self._state.commit_slots(pending.slots, rows_kept - 1)  # one launch on the kernels
            self._len = self._recurrent_pos = pending.start + rows_kept
            self.counters.slot_commits += 1
            return "committed"
        if rows_kept == rows:
            return "committed" if self._per_row else None
        self._state.restore(pending.saved)
        self._len = self._recurrent_pos = pending.start
        self.counters.state_restores += 1
        with torch.no_grad():
            self.trunk.forward(pending.tokens[:rows_kept], pending.start, self._state, slots=False)
        self.counters.forward_calls += 1
        self.counters.forward_rows += rows_kept
        self._len = self._recurrent_pos = pending.start + rows_kept
        return "committed" if self._per_row else "reforward"

    def spec_rewind_cache(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot rewind to {length}: the cache holds {self._len}")
        self._drop_pending()
        if length == 0:
            self._state.zero_recurrent()
            self._recurrent_pos = 0
            if self.draft_head is not None:
                self.draft_head.reset()
        elif length != self._recurrent_pos:
            raise ValueError(
                f"cannot rewind a hybrid trunk to {length}: its recurrent state stands at "
                f"{self._recurrent_pos} (keep rows with spec_keep, or rewind to 0)"
            )
        self._len = length

    def _drop_pending(self) -> None:
        """Forget an unresolved verify: the live state goes back to the pre-verify state."""
        pending, self._pending = self._pending, None
        if pending is not None:
            if pending.saved is not None:
                self._state.restore(pending.saved)
            self._len = self._recurrent_pos = pending.start
