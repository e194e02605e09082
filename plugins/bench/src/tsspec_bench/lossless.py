"""The benchmark's losslessness check: speculative output must equal plain output.

On an exact target (the float64 toy) outputs must be identical. On a real model a multi-row
verify is not bit-identical to a one-row step (CPU matmuls change their last bits with the number
of rows), so a near-tie in the logits can flip a token without any bug. The check is therefore
tie-aware: outputs are identical, or at the first divergence the plain logits, recomputed with a
plain forward over the common prefix, are a float tie between the two tokens. Anything else is
a real mismatch and fails the benchmark.

Tie test, for greedy and sampled decoding alike: raise the speculative token's logit by
``TIE_TOLERANCE``; if the sampler then draws it (or already draws it from the recomputed
logits), the two tokens were within float noise of each other. For greedy decoding that is
exactly "plain top-1 logit - speculative token's logit < 1e-3", which implies a top-2 gap < 1e-3.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from tsspec.runtime import trunk as trunks
from tsspec.runtime.sampling import Sampler, SamplingParams

TIE_TOLERANCE = 1e-3  # logit difference treated as a float tie

IDENTICAL, TIE, MISMATCH = "identical", "tie", "mismatch"


@attrs.frozen
class LosslessVerdict:
    """Outcome of comparing one speculative run with the plain reference."""

    status: str  # identical | tie | mismatch
    position: int | None = None  # index of the first differing emitted token
    plain_token: int | None = None
    spec_token: int | None = None
    top2_gap: float | None = None  # plain logits at the divergence: top-1 minus top-2
    token_gap: float | None = None  # plain logit of the plain token minus the spec token's
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status != MISMATCH

    def to_json(self) -> dict:
        return attrs.asdict(self)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (None when equal).

    >>> first_divergence([1, 2, 3], [1, 5, 3])
    1
    >>> first_divergence([1, 2], [1, 2, 3])
    2
    """
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def plain_logits_after(target, ids: Sequence[int]):
    """Logits [vocab] predicting the token after ``ids``: one plain forward over all of them."""
    trunk = target
    trunk.spec_rewind_cache(0)
    trunk.spec_ensure_capacity(len(ids))
    logits, _ = trunks.forward_all(trunk, list(ids), want_hidden=False)  # [1, vocab]
    trunk.spec_rewind_cache(0)
    return logits[-1]


def check_lossless(
    target,
    prompt_ids: Sequence[int],
    plain: Sequence[int],
    spec: Sequence[int],
    sampling: SamplingParams | None = None,
) -> LosslessVerdict:
    """Compare a speculative run's tokens with the plain reference, tie-aware."""
    j = first_divergence(plain, spec)
    if j is None:
        return LosslessVerdict(IDENTICAL)
    if j >= len(plain) or j >= len(spec):
        longer = "speculative" if len(spec) > len(plain) else "plain"
        return LosslessVerdict(
            MISMATCH, j, reason=f"the {longer} run emitted more tokens ({len(spec)} vs {len(plain)} plain)"
        )
    p_tok, s_tok = int(plain[j]), int(spec[j])
    preceding = [int(t) for t in prompt_ids] + [int(t) for t in plain[:j]]
    sampler = Sampler(sampling or SamplingParams())
    logits = plain_logits_after(target, preceding).detach().to("cpu").double()  # [vocab]
    adjusted = sampler.adjust(logits, preceding)
    top2 = adjusted.topk(2).values
    top2_gap = float(top2[0] - top2[1])
    token_gap = float(adjusted[p_tok] - adjusted[s_tok])
    position = len(preceding)
    nudged = logits.clone()
    nudged[s_tok] += TIE_TOLERANCE
    tie = sampler.sample(logits, position, preceding) == s_tok or sampler.sample(nudged, position, preceding) == s_tok
    status = TIE if tie else MISMATCH
    reason = (
        f"token {j}: plain {p_tok}, speculative {s_tok}; plain logit gap {token_gap:.3g} "
        f"(top-2 gap {top2_gap:.3g}) {'<' if tie else '>='} {TIE_TOLERANCE:g}"
    )
    return LosslessVerdict(status, j, p_tok, s_tok, top2_gap, token_gap, reason)
