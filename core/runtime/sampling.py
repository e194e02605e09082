"""Sampling: greedy, or temperature / top-k / top-p / min-p with a logit bias and repetition,
presence and frequency penalties, seeded so that the draw for absolute position ``p`` depends only
on (seed, p, logits, preceding tokens).

That property is what makes speculation lossless under sampling too: the verify row that draws
position ``p`` sees the same logits and the same uniform number as the plain step would, so it
draws the same token. Drafts are accepted while the draw equals the draft ("sample each row,
accept while equal"), which needs no rejection-sampling maths.

Worked example: seed 7, position 12, logits favour token 3 with p=0.6, token 9 with p=0.4. The
uniform for (7, 12) is u=0.71; the inverse CDF over the sorted probabilities [3: 0.6, 9: 0.4]
passes 0.6 at token 3 and lands on token 9. Any run, plain or speculative, drawing position 12
from those logits gets token 9.
"""

from __future__ import annotations

import math
from typing import Sequence

import attrs
import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _check_nonneg(instance, attribute, value):
    if not 0 <= value < math.inf:  # NaN fails every comparison: it is rejected too
        raise ValueError(f"--{attribute.name.replace('_', '-')} must be a finite number >= 0, got {value}")


def _check_unit(instance, attribute, value):
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"--{attribute.name.replace('_', '-')} must be between 0 and 1, got {value}")


@attrs.frozen
class SamplingParams:
    """How each position's token is drawn. temperature 0 means greedy (argmax)."""

    temperature: float = attrs.field(default=0.0, validator=_check_nonneg)
    top_k: int = attrs.field(default=0, validator=_check_nonneg)  # 0: off
    top_p: float = attrs.field(default=1.0, validator=_check_unit)  # 1: off
    min_p: float = attrs.field(default=0.0, validator=_check_unit)  # 0: off
    repeat_penalty: float = attrs.field(default=1.0)  # 1: off (llama.cpp semantics)
    repeat_last_n: int = attrs.field(default=64, validator=_check_nonneg)  # window of every penalty
    seed: int = 0
    # OpenAI's penalties with llama.cpp's semantics: logit -= count * frequency + (count > 0) *
    # presence, counting the last ``repeat_last_n`` tokens (prompt included); 0: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), sorted by id

    def __attrs_post_init__(self):
        if not self.repeat_penalty > 0:
            raise ValueError(f"--repeat-penalty must be > 0, got {self.repeat_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be between -2 and 2, got {getattr(self, name)}")

    @property
    def penalised(self) -> bool:
        """Whether any penalty reads preceding tokens."""
        return self.repeat_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _splitmix64(x: int) -> int:
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, position)."""
    mixed = _splitmix64(_splitmix64(seed & _MASK64) ^ (position & _MASK64))
    return (mixed >> 11) * (1.0 / (1 << 53))


NUMPY_ARGMAX_DTYPES = (torch.float32, torch.float64)


def greedy_token(logits: torch.Tensor) -> int:
    """``torch.argmax(logits)`` of a [vocab] row: the first index of the largest value (the
    first NaN where there is one). CPU float rows go through numpy's argmax, which has the same
    rule and runs on the calling thread: torch's splits 49,152 values over its OpenMP threads,
    and waking them costs more than the pass itself."""
    # (a row with torch's negative bit set, e.g. the imaginary part of a conjugated complex
    # tensor, has no numpy view: torch's argmax reads it)
    if (logits.device.type == "cpu" and logits.dtype in NUMPY_ARGMAX_DTYPES and logits.dim() == 1
            and not logits.is_neg()):
        return int(logits.detach().numpy().argmax())
    return int(torch.argmax(logits).item())


@attrs.frozen
class TokenLogprob:
    """One emitted token's log-probability and the ``top`` most likely (id, logprob) at its
    position, from the adjusted logits (bias and penalties applied, before temperature)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class Sampler:
    """Draws one token per logits row. Stateless apart from its parameters and, when
    ``logprobs`` is set (how many alternatives to keep, 0: the drawn token's only), the
    ``TokenLogprob`` of each position it drew (``recorded``, by absolute position)."""

    def __init__(self, params: SamplingParams | None = None, *, logprobs: int | None = None):
        self.params = params or SamplingParams()
        self.logprobs = logprobs
        self.recorded: dict[int, TokenLogprob] = {}
        bias = self.params.logit_bias
        self._bias = (torch.tensor([i for i, _ in bias], dtype=torch.long),
                      torch.tensor([b for _, b in bias], dtype=torch.float64)) if bias else None

    @property
    def lookback(self) -> int:
        """How many preceding tokens the adjustments read (0: none; callers may pass fewer). A
        logit bias reads none but changes logits: it reports 1, as DraftContext asks."""
        p = self.params
        return p.repeat_last_n if p.penalised else (1 if p.logit_bias else 0)

    def adjust(self, logits: torch.Tensor, preceding: Sequence[int]) -> torch.Tensor:
        """Apply the logit adjustments: the bias, then the penalties over the preceding tokens
        (llama.cpp's order: repetition, then frequency and presence).

        logits: [vocab]. Returns a new tensor when anything changes. Drafters call this too
        (through DraftContext.adjust_logits) so penalties do not make drafts systematically wrong.
        """
        p = self.params
        out = logits
        if self._bias is not None:
            ids, values = self._bias
            keep = ids < logits.shape[-1]
            out = logits.clone()
            out[ids[keep]] += values[keep].to(out.dtype)
        if not p.penalised or not preceding:
            return out
        counts: dict[int, int] = {}
        for t in preceding[-p.repeat_last_n :]:
            t = int(t)
            if 0 <= t < logits.shape[-1]:
                counts[t] = counts.get(t, 0) + 1
        if not counts:
            return out
        if out is logits:
            out = logits.clone()
        ids = torch.tensor(sorted(counts), dtype=torch.long)  # [n]
        picked = out[ids]  # [n]
        if p.repeat_penalty != 1.0:
            picked = torch.where(picked > 0, picked / p.repeat_penalty, picked * p.repeat_penalty)
        if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            n = torch.tensor([counts[int(i)] for i in ids], dtype=torch.float64)  # [n]
            picked = (picked.to(torch.float64) - n * p.frequency_penalty - p.presence_penalty).to(out.dtype)
        out[ids] = picked
        return out

    def _record(self, logits: torch.Tensor, position: int, token: int) -> None:
        """Keep the drawn token's log-probability (and the top alternatives) at ``position``."""
        logp = torch.log_softmax(logits.to(torch.float64), dim=-1)  # [vocab]
        top: tuple[tuple[int, float], ...] = ()
        if self.logprobs:
            values, order = torch.topk(logp, min(self.logprobs, logp.shape[-1]))
            top = tuple((int(i), float(v)) for i, v in zip(order.tolist(), values.tolist()))
        self.recorded[position] = TokenLogprob(token, float(logp[token]), top)

    def sample(self, logits: torch.Tensor, position: int, preceding: Sequence[int]) -> int:
        """Draw the token at absolute ``position`` from ``logits`` [vocab]; ``preceding`` are the
        tokens before it (for the repetition penalty)."""
        logits = self.adjust(logits, preceding)
        token = self._draw(logits, position)
        if self.logprobs is not None:
            self._record(logits, position, token)
        return token

    def _draw(self, logits: torch.Tensor, position: int) -> int:
        p = self.params
        if p.greedy:
            return greedy_token(logits)
        scaled = logits.to(torch.float64) / p.temperature
        if p.top_k > 0 and p.top_k < scaled.shape[-1]:
            values, order = torch.topk(scaled, p.top_k)
        else:
            values, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(values, dim=-1)  # [k], descending
        keep = probs.shape[-1]
        if p.min_p > 0.0:
            keep = min(keep, int((probs >= p.min_p * probs[0]).sum().item()))
        if p.top_p < 1.0:
            cumulative = torch.cumsum(probs, dim=-1)
            # smallest prefix whose mass reaches top_p (always at least one token)
            keep = min(keep, int((cumulative < p.top_p).sum().item()) + 1)
        probs = probs[: max(1, keep)]
        cdf = torch.cumsum(probs / probs.sum(), dim=-1)
        u = position_uniform(p.seed, position)
        index = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype)).item())
        return int(order[min(index, probs.shape[-1] - 1)].item())
