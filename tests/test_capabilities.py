"""The one reader of plugin objects (``tsspec.capabilities``): defaults, named errors, the gate,
and that nothing else in the core probes a plugin object for a capability."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tsspec.capabilities import (
    ContractError,
    SpeculatorInfo,
    drafter_info,
    paged_info,
    speculator_info,
    target_info,
)
from tsspec.protocols import DraftHeadKind
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.registry import PLUGIN_ERROR, Decline, SpeculatorRegistry
from tsspec.testing import ToyTarget, assert_lossless

CORE = Path(__file__).resolve().parents[1] / "core"
# every optional member of a plugin object the contract defines (speculator, target, head, paged KV)
CAPABILITIES = (
    "max_draft_tokens", "min_draft_prob", "default_min_draft_prob", "needs_hidden_state",
    "handles_own_prefill", "can_arm_after_prefix_reuse", "speculation_profitable", "speculation_refusal",
    "spec_preferred_draft_window",
    "spec_verify_persists_accepted_kv", "spec_verify_row_ms", "spec_open_paged", "adopted_prefix",
    "extra_cost_ms", "auto_fallback", "resumes_after_gap", "row_invariant", "resumes_prefix",
    "prefix_refusal", "release",
)  # commit, reset, close, keep, kind: names too common to grep for; read in capabilities.py too


class Lookup:
    """The least a weight-free speculator is: a name and propose (a 1-gram lookup)."""

    name = "lookup"

    def propose(self, ctx):
        history = list(ctx.history)
        for i in range(len(history) - 2, -1, -1):
            if history[i] == ctx.last_token:
                return history[i + 1 : i + 1 + ctx.max_tokens]
        return []


def test_no_capability_probe_outside_the_reader():
    """``getattr(x, "<capability>"`` / ``hasattr`` appear in core only in capabilities.py."""
    names = "|".join(CAPABILITIES)
    probe = re.compile(rf"""(getattr|hasattr)\([^,()]+,\s*["']({names})["']""")
    offenders = [
        f"{path.relative_to(CORE)}:{n}: {line.strip()}"
        for path in sorted(CORE.rglob("*.py")) if path.name != "capabilities.py"
        for n, line in enumerate(path.read_text().splitlines(), 1) if probe.search(line)
    ]
    assert not offenders, offenders


def test_a_name_and_propose_are_a_speculator():
    info = speculator_info(Lookup())
    assert info == SpeculatorInfo(name="lookup", propose=info.propose, commit=info.commit, reset=info.reset,
                                  close=info.close)
    assert info.max_draft_tokens is None and info.min_draft_prob == info.default_min_draft_prob == 0.0
    assert not (info.needs_hidden_state or info.handles_own_prefill or info.can_arm_after_prefix_reuse)
    info.commit([1], None, 0), info.reset(), info.close()  # defaults do nothing


@pytest.mark.parametrize("sampling", [None, "seeded"])
def test_the_least_speculator_is_lossless_through_the_registry(sampling):
    from tsspec.runtime.sampling import SamplingParams

    params = SamplingParams(temperature=0.8, top_k=12, seed=5) if sampling else None
    registry = SpeculatorRegistry()
    registry.register("lookup", lambda target, options: Lookup(), requires_draft_head=False)
    options = SpeculationOptions(spec_type="lookup")
    made = registry.create(ToyTarget(), options)
    assert not isinstance(made, Decline)
    _, spec = assert_lossless(ToyTarget, lambda target: registry.create(target, options), [1, 2, 3, 1, 2, 3, 1],
                              max_tokens=30, sampling=params, options=options)
    assert spec.stats.draft_tokens > 0 and spec.stats.faults == 0


@pytest.mark.parametrize("member, value, phrase", [
    ("name", "", "has no name"),
    ("propose", None, "no callable propose"),
    ("needs_hidden_state", "yes", "needs_hidden_state must be True or False"),
    ("max_draft_tokens", -1, "max_draft_tokens must be"),
    ("default_min_draft_prob", 1.5, "default_min_draft_prob must be a number in [0, 1]"),
    ("reset", 3, "reset must be a method"),
    ("close", "no", "close must be a method"),
])
def test_a_wrong_member_is_named_when_the_registry_makes_it(member, value, phrase):
    spec = Lookup()
    setattr(spec, member, value)
    with pytest.raises(ContractError, match=re.escape(phrase)):
        speculator_info(spec)
    registry = SpeculatorRegistry()
    registry.register("bad", lambda target, options: spec, requires_draft_head=False, plugin="p")
    decline = registry.create(ToyTarget(), SpeculationOptions(spec_type="bad"))
    assert isinstance(decline, Decline) and decline.code == PLUGIN_ERROR and phrase in decline.reason


def test_a_speculator_class_registered_as_its_factory_is_checked_at_registration():
    class NoPropose:
        name = "np"

    class WrongFlag(Lookup):
        handles_own_prefill = "reserved"

    registry = SpeculatorRegistry()
    with pytest.raises(ContractError, match="no callable propose"):
        registry.register("np", NoPropose, requires_draft_head=False)
    with pytest.raises(ContractError, match="handles_own_prefill must be True or False"):
        registry.register("wf", WrongFlag, requires_draft_head=False)
    registry.register("lookup", Lookup, requires_draft_head=False)  # its members pass the check
    assert registry.get("lookup") is not None


class Gated(Lookup):
    default_min_draft_prob = 0.6

    def __init__(self):
        self.min_draft_prob = 0.0


@pytest.mark.parametrize("pmin, gate", [(None, 0.6), (0.25, 0.25)])
def test_one_gate_the_operators_pmin_else_the_speculators_default(pmin, gate):
    registry = SpeculatorRegistry()
    registry.register("gated", lambda target, options: Gated(), requires_draft_head=False)
    made = registry.create(ToyTarget(), SpeculationOptions(spec_type="gated", pmin=pmin))
    assert made.min_draft_prob == gate and speculator_info(made).min_draft_prob == gate
    unbound = speculator_info(Gated())  # made by hand: its own gate, its declared default
    assert (unbound.min_draft_prob, unbound.default_min_draft_prob) == (0.0, 0.6)


def test_handles_own_prefill_means_the_prompt_is_not_committed():
    from tsspec.runtime.generation import generate

    class Recorder(Lookup):
        def __init__(self, own):
            self.handles_own_prefill, self.commits = own, []

        def commit(self, tokens, rows, start):
            self.commits.append((start, list(tokens)))

    prompt = [4, 5, 6, 4, 5]
    told, own = Recorder(False), Recorder(True)
    outs = [generate(ToyTarget(), prompt, max_tokens=6, speculator=s).tokens for s in (told, own)]
    assert outs[0] == outs[1]
    assert told.commits[0] == (0, prompt) and all(start >= len(prompt) for start, _ in own.commits)
    assert told.commits[1:] == own.commits


def test_target_drafter_and_paged_defaults():
    bare = object()
    info = target_info(bare)
    assert info.speculation_profitable and info.speculation_refusal is None
    assert info.preferred_draft_window is None and not info.verify_persists_accepted_kv and not info.batched
    assert info.drafter == drafter_info(None) and info.drafter.kind is DraftHeadKind.NONE
    target = ToyTarget()
    assert target_info(target).verify_persists_accepted_kv == bool(target.spec_verify_persists_accepted_kv)

    class Head:
        kind, block_size, auto_fallback = DraftHeadKind.BLOCK, 16, True

    head = drafter_info(Head())
    facts = (head.kind, head.block_size, head.auto_fallback, head.resumes_after_gap)
    assert facts == (DraftHeadKind.BLOCK, 16, True, False)
    paged = paged_info(object())
    assert paged.row_invariant and paged.resumes_prefix and paged.keep is None and paged.release is None


def test_the_least_speculator_runs_without_a_warning(caplog):
    """No member the loop or generate calls is missing: no fault, no 'close raised'."""
    import logging

    from tsspec.runtime.generation import generate

    with caplog.at_level(logging.WARNING):
        # the governor off: its park depends on wall-clock step times, this test on members only
        gen = generate(ToyTarget(), [1, 2, 3, 1, 2, 3, 1], SpeculationOptions(adaptive=False), max_tokens=20,
                       speculator=Lookup())
    assert gen.stats.faults == 0 and gen.stats.draft_tokens > 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
