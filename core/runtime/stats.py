"""Statistics of a generation, named as peers name them (vLLM's accepted-per-position, SGLang's
accept length, TensorSharp's phase milliseconds)."""

from __future__ import annotations

import json
from typing import Any

import attrs

PHASES = ("prefill", "draft", "verify", "rollback", "snapshot", "commit", "plain")


@attrs.define
class SpecStats:
    """Counters for one run (or, summed with ``merge``, for many)."""

    prompt_tokens: int = 0
    emitted_tokens: int = 0
    steps: int = 0  # decode steps (verify steps + plain steps)
    verify_steps: int = 0  # steps that verified at least one draft token
    plain_steps: int = 0
    drafts: int = 0  # proposals that reached verification
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = attrs.field(factory=list)  # [k]: drafts whose token k was accepted
    rollback_modes: dict[str, int] = attrs.field(factory=dict)  # all / committed / rewound / reforward
    phase_ms: dict[str, float] = attrs.field(factory=lambda: {p: 0.0 for p in PHASES})
    governor_wins: int = 0
    governor_losses: int = 0
    governor_parked_steps: int = 0
    declined_drafts: int = 0  # keyed proposals not verified (their key's drafts do not pay): plain steps
    faults: int = 0  # untrusted proposals or speculator exceptions caught
    fault_kinds: dict[str, int] = attrs.field(factory=dict)
    speculator_parked: bool = False
    wall_ms: float = 0.0
    decode_ms: float = 0.0
    prefix_reused: int = 0  # prompt tokens whose KV came from a cache (not prefilled)
    armed_after_reuse: bool = False  # did the speculator arm after that reused prefix?

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_verify(self) -> float:
        """Mean tokens emitted per verify step (accepted drafts + the bonus/correction token)."""
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: emitted tokens after the first, over decode time (prefill excluded)."""
        decoded = max(0, self.emitted_tokens - 1)
        return decoded / (self.decode_ms / 1000.0) if self.decode_ms > 0 else 0.0

    def add_phase(self, phase: str, ms: float) -> None:
        self.phase_ms[phase] = self.phase_ms.get(phase, 0.0) + ms

    def record_acceptance(self, drafted: int, accepted: int) -> None:
        self.drafts += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        if len(self.accepted_per_position) < drafted:
            self.accepted_per_position.extend([0] * (drafted - len(self.accepted_per_position)))
        for k in range(accepted):
            self.accepted_per_position[k] += 1

    def record_fault(self, kind: str) -> None:
        self.faults += 1
        self.fault_kinds[kind] = self.fault_kinds.get(kind, 0) + 1

    def merge(self, other: "SpecStats") -> "SpecStats":
        """Cumulative stats: the sum of two runs."""
        out = SpecStats()
        for field in attrs.fields(SpecStats):
            a, b = getattr(self, field.name), getattr(other, field.name)
            if isinstance(a, bool):
                value = a or b
            elif isinstance(a, (int, float)):
                value = a + b
            elif isinstance(a, list):
                n = max(len(a), len(b))
                value = [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]
            else:
                value = {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}
            setattr(out, field.name, value)
        return out

    def to_json(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["phase_ms"] = {k: round(v, 3) for k, v in self.phase_ms.items()}
        data["acceptance_rate"] = round(self.acceptance_rate, 4)
        data["tokens_per_verify"] = round(self.tokens_per_verify, 4)
        data["tokens_per_second"] = round(self.tokens_per_second, 3)
        return data

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    def one_line(self) -> str:
        ph = self.phase_ms
        parts = [
            f"tokens={self.emitted_tokens}",
            f"tok/s={self.tokens_per_second:.1f}",
            f"steps={self.steps}",
            f"verify={self.verify_steps}",
            f"accepted={self.accepted_tokens}/{self.draft_tokens}",
            f"accept={self.acceptance_rate:.2f}",
            f"tok/verify={self.tokens_per_verify:.2f}",
            "ms[" + " ".join(f"{p}={ph.get(p, 0.0):.0f}" for p in PHASES) + "]",
            f"governor[win={self.governor_wins} loss={self.governor_losses} parked={self.governor_parked_steps}"
            + (f" declined={self.declined_drafts}]" if self.declined_drafts else "]"),
        ]
        if self.prefix_reused:
            parts.append(f"prefix_reused={self.prefix_reused} armed={'yes' if self.armed_after_reuse else 'no'}")
        if self.faults:
            parts.append(f"faults={self.faults}")
        return " ".join(parts)
