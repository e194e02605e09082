"""Sampling: greedy, or temperature / top-k / top-p / min-p with a logit bias and repetition,
presence and frequency penalties. The draw for absolute position ``p`` depends only on (seed,
p, logits, preceding tokens), so a verify row draws exactly what the plain step would: drafts
are accepted while the draw equals the draft, and speculation stays lossless under sampling."""

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
    """``torch.argmax`` of a [vocab] row (first largest, first NaN); CPU float rows use numpy's
    argmax, same rule, on the calling thread (torch's wakes its OpenMP threads)."""
    # (a row with torch's negative bit set, e.g. the imaginary part of a conjugated complex
    # tensor, has no numpy view: torch's argmax reads it)
    if (logits.device.type == "cpu" and logits.dtype in NUMPY_ARGMAX_DTYPES and logits.dim() == 1
            and not logits.is_neg()):
        return int(logits.detach().numpy().argmax())
    return int(torch.argmax(logits).item())


@attrs.frozen
class TokenLogprob:
    """An emitted token's log-probability and the ``top`` (id, logprob) at its position."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class Sampler:
    """Draws one token per logits row; with ``logprobs``, keeps each position's in ``recorded``."""

    def __init__(self, params: SamplingParams | None = None, *, logprobs: int | None = None):
        self.params = params or SamplingParams()
        self.logprobs = logprobs
        self.recorded: dict[int, TokenLogprob] = {}
        bias = self.params.logit_bias
        self._bias = (torch.tensor([i for i, _ in bias], dtype=torch.long),
                      torch.tensor([b for _, b in bias], dtype=torch.float64)) if bias else None

    @property
    def lookback(self) -> int:
        """Preceding tokens the adjustments read (0: none); a logit bias reports 1."""
        p = self.params
        return p.repeat_last_n if p.penalised else (1 if p.logit_bias else 0)

    def adjust(self, logits: torch.Tensor, preceding: Sequence[int]) -> torch.Tensor:
        """The bias, then the penalties over ``preceding`` (llama.cpp's order); logits [vocab]. Drafters
        call it too (``DraftContext.adjust_logits``)."""
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
        """Draw the token at ``position`` from ``logits`` [vocab] after ``preceding``."""
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
