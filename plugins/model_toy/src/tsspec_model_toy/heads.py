"""Toy per-token draft heads: tiny, exact (float64), seeded MTP-shaped drafters for tests.

Why a toy head: the ``draft-head`` algorithm is only correct if the head's own KV cache tracks
what really landed in the trunk (catch-up after every commit, dropping rejected drafts), and only
fast if the catch-up folds into the next draft step. A head with its own cache and call counters
makes both observable on a CPU in milliseconds, without a trained checkpoint.

The head is shaped like a NextN/MTP block. For one row (token ``t`` at position ``p``, with
``h_prev`` the trunk row that predicted ``t``)::

    x      = W_in @ [rmsnorm(E[t]) ; rmsnorm(h_prev)]         # [H]
    k, v   = W_k @ x, W_v @ x            -> own cache at position p (entries >= p dropped first)
    x      = x + W_o @ attend(W_q @ x, cache entries <= p)
    h_out  = x + W_2 @ silu(W_1 @ rmsnorm(x))                 # [H], chained into the next step
    logits = logit_scale * (W_lm @ rmsnorm(h_out))            # [vocab]

Two modes:

* random (default): seeded random weights. Drafts are mostly wrong, so runs exercise rejections.
  A large ``logit_scale`` makes the head confidently wrong (it passes the confidence gate).
* oracle: ``oracle(tokens) -> logits [vocab]`` gives a reference next-token distribution for the
  head's own view of the sequence (the tokens in its cache); ``oracle_scale * oracle(...)`` is
  added to the logits. With ``PrefixReference`` over a second copy of the target the head drafts
  what the target would say, so acceptance is high, and it drops if the head's cache is wrong.

Every row is computed on its own (matrix-vector products), so the fused
``draft_catch_up_and_step`` equals ``draft_catch_up`` + ``draft_step`` bit for bit. A real head
batches its catch-up rows; here exactness is worth more than speed.
"""

from __future__ import annotations

import bisect
import math
from typing import Callable, Sequence

import torch

from tsspec.protocols import DraftHeadKind

__all__ = ["ToyPerTokenHead", "PrefixReference"]

RMS_EPS = 1e-6
FFN_MULTIPLIER = 2  # ffn width = FFN_MULTIPLIER * hidden_size unless given


def _rmsnorm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean() + RMS_EPS)


class PrefixReference:
    """Next-token logits of a token prefix, read off a (separate) target: an oracle for a head.

    Calls usually extend the previous prefix by a token (a draft chain), so only the new tokens
    are forwarded; any other prefix restarts the target from position 0 (``spec_rewind_cache(0)``
    also clears recurrent state, so no snapshot is needed). The target must not be the one being
    decoded: this one is advanced and rewound freely.
    """

    def __init__(self, target) -> None:
        self.target = target
        self.forwarded_tokens = 0  # rows forwarded, for tests and cost accounting
        self._tokens: list[int] = []
        self._last: torch.Tensor | None = None  # [vocab]

    def __call__(self, tokens: Sequence[int]) -> torch.Tensor:
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("PrefixReference needs at least one token")
        n = len(self._tokens)
        if tokens == self._tokens and self._last is not None:
            return self._last
        if len(tokens) > n and tokens[:n] == self._tokens:
            new = tokens[n:]
        else:
            self.target.spec_rewind_cache(0)
            new = tokens
        self._tokens, self._last = [], None  # until the forward succeeds: a failure restarts
        self.target.spec_ensure_capacity(len(tokens))
        logits, _ = self.target.spec_forward(new, all_logits_rows=False, want_hidden=False)
        self.target.spec_keep(len(new))
        self.forwarded_tokens += len(new)
        self._tokens = tokens
        self._last = logits[-1]  # [vocab]
        return self._last


class ToyPerTokenHead:
    """A per-token draft head (DraftHead protocol, kind PER_TOKEN) with its own KV cache.

    ``hidden_size`` is the width of the trunk rows it reads (the target's ``spec_feature_size``).
    Counters: ``calls`` (every head call), ``step_calls``, ``catch_up_calls``, ``fused_calls``
    and ``rows`` (rows computed); ``reset()`` clears the cache, ``reset_counters()`` the counters.
    """

    kind = DraftHeadKind.PER_TOKEN
    block_size = 1

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        *,
        seed: int = 0,
        ffn_size: int | None = None,
        logit_scale: float = 1.0,
        oracle: Callable[[Sequence[int]], torch.Tensor] | None = None,
        oracle_scale: float = 1.0,
        resumes_after_gap: bool = False,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        if vocab_size < 1 or hidden_size < 1:
            raise ValueError(f"vocab_size and hidden_size must be positive, got {vocab_size}, {hidden_size}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.logit_scale = float(logit_scale)
        self.oracle = oracle
        self.oracle_scale = float(oracle_scale)
        self.resumes_after_gap = bool(resumes_after_gap)
        self.dtype = dtype
        h, f = hidden_size, ffn_size or FFN_MULTIPLIER * hidden_size
        gen = torch.Generator().manual_seed(seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, generator=gen, dtype=dtype) / math.sqrt(cols)

        self.embed = torch.randn(vocab_size, h, generator=gen, dtype=dtype)  # [vocab, H]
        self.w_in = weight(h, 2 * h)  # [H, 2H]
        self.w_q, self.w_k, self.w_v, self.w_o = (weight(h, h) for _ in range(4))  # [H, H]
        self.w_1 = weight(f, h)  # [F, H]
        self.w_2 = weight(h, f)  # [H, F]
        self.lm_head = weight(vocab_size, h)  # [vocab, H]
        # the cache, sorted by position; a gap (positions never caught up) is simply absent
        self._positions: list[int] = []
        self._tokens: list[int] = []
        self._keys: list[torch.Tensor] = []  # each [H]
        self._values: list[torch.Tensor] = []  # each [H]
        self.reset_counters()

    @classmethod
    def for_target(
        cls, target, *, oracle_target=None, seed: int = 0, **kwargs
    ) -> "ToyPerTokenHead":
        """A head sized for ``target``; ``oracle_target`` (a separate copy of the same model)
        turns on oracle mode through ``PrefixReference``."""
        oracle = PrefixReference(oracle_target) if oracle_target is not None else None
        return cls(
            target.config.vocab_size, target.spec_feature_size, seed=seed, oracle=oracle, **kwargs
        )

    # -- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the sequence (a new one starts); counters survive."""
        self._truncate(0)

    def reset_counters(self) -> None:
        self.calls = 0
        self.step_calls = 0
        self.catch_up_calls = 0
        self.fused_calls = 0
        self.rows = 0

    @property
    def cache_positions(self) -> list[int]:
        """Positions the head holds KV for (a copy)."""
        return list(self._positions)

    @property
    def cache_tokens(self) -> list[int]:
        """Tokens the head holds KV for, in position order (a copy)."""
        return list(self._tokens)

    def _truncate(self, position: int) -> None:
        keep = bisect.bisect_left(self._positions, position)
        del self._positions[keep:], self._tokens[keep:], self._keys[keep:], self._values[keep:]

    # -- one row -----------------------------------------------------------------------------
    def _row(
        self, token: int, h_prev: torch.Tensor, pos: int, *, want_logits: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Write (token, h_prev) at ``pos`` into the cache; return (logits [vocab] or None when
        not wanted (catch-up rows), h_out [H])."""
        if not 0 <= int(token) < self.vocab_size:
            raise ValueError(f"token {token} outside the head's vocabulary of {self.vocab_size}")
        h_prev = h_prev.reshape(-1).to(self.dtype)  # [H]
        if h_prev.shape[0] != self.hidden_size:
            raise ValueError(f"h_prev has {h_prev.shape[0]} features, the head reads {self.hidden_size}")
        self._truncate(pos)
        self.rows += 1
        x = self.w_in @ torch.cat([_rmsnorm(self.embed[int(token)]), _rmsnorm(h_prev)])  # [H]
        self._positions.append(int(pos))
        self._tokens.append(int(token))
        self._keys.append(self.w_k @ x)
        self._values.append(self.w_v @ x)
        keys, values = torch.stack(self._keys), torch.stack(self._values)  # [n, H] each
        weights = torch.softmax(keys @ (self.w_q @ x) / math.sqrt(self.hidden_size), dim=0)  # [n]
        x = x + self.w_o @ (weights @ values)
        h_out = x + self.w_2 @ torch.nn.functional.silu(self.w_1 @ _rmsnorm(x))  # [H]
        if not want_logits:
            return None, h_out
        logits = self.logit_scale * (self.lm_head @ _rmsnorm(h_out))  # [vocab]
        if self.oracle is not None:
            reference = self.oracle(self._tokens).to(self.dtype)[: self.vocab_size]
            logits = logits + self.oracle_scale * reference
        return logits, h_out

    # -- DraftHead protocol ------------------------------------------------------------------
    def draft_step(
        self, token: int, h_prev: torch.Tensor, pos: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head call: (logits [vocab] for pos+1, h_out [H] to chain)."""
        self.calls += 1
        self.step_calls += 1
        return self._row(token, h_prev, pos)

    def draft_catch_up(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int) -> None:
        """One head call: write the exact rows that landed (h_rows [n, H]) from ``start_pos``,
        dropping everything the head held at or beyond it (rejected drafts)."""
        self.calls += 1
        self.catch_up_calls += 1
        self._truncate(start_pos)
        for k, token in enumerate(tokens):
            self._row(token, h_rows[k], start_pos + k, want_logits=False)

    def draft_catch_up_and_step(
        self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head call over n rows: catch up on all of them and return the step output of the
        last, i.e. ``draft_catch_up(tokens[:-1], h_rows[:-1], start_pos)`` followed by
        ``draft_step(tokens[-1], h_rows[-1], start_pos + n - 1)``."""
        if len(tokens) == 0:
            raise ValueError("draft_catch_up_and_step needs at least one row")
        self.calls += 1
        self.fused_calls += 1
        self._truncate(start_pos)
        for k, token in enumerate(tokens[:-1]):
            self._row(token, h_rows[k], start_pos + k, want_logits=False)
        last = len(tokens) - 1
        return self._row(tokens[last], h_rows[last], start_pos + last)

    def draft_block(
        self, last_token: int, h_prev: torch.Tensor, position: int, max_tokens: int
    ) -> tuple[list[int], list[float]]:
        """A block by chaining ``draft_step`` greedily (what a per-token head can offer a block
        caller); confidences are each token's softmax probability."""
        tokens: list[int] = []
        confidences: list[float] = []
        token, hidden = int(last_token), h_prev
        for k in range(max_tokens):
            logits, hidden = self.draft_step(token, hidden, position + k)
            probs = torch.softmax(logits, dim=-1)  # [vocab]
            token = int(torch.argmax(probs).item())
            tokens.append(token)
            confidences.append(float(probs[token].item()))
        return tokens, confidences
