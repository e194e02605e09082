"""The registration: entry point, factory declines, options, and `auto` picking draft-head."""

from __future__ import annotations

import pytest

from tsspec.plugins import PluginControls, PluginHost
from tsspec.protocols import DraftHeadKind, SpeculatorDeclined
from tsspec.runtime.catalog import build_catalog
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.registry import CANNOT_SERVE, NO_DRAFT_HEAD
from tsspec.testing import ToyTarget
from tsspec_model_toy.heads import ToyPerTokenHead
from tsspec_draft_head import DraftHeadSpeculator, make_draft_head


class BlockHead:
    kind = DraftHeadKind.BLOCK
    block_size = 16
    resumes_after_gap = True


def _toy(head=True, **kwargs) -> ToyTarget:
    target = ToyTarget(seed=2, **kwargs)
    if head:
        target.draft_head = ToyPerTokenHead.for_target(target, seed=1)
    return target


@pytest.fixture(scope="module")
def registry():
    return build_catalog(PluginHost(PluginControls(enabled=frozenset({"draft-head"})))).speculators


def test_entry_point_registers_draft_head(registry):
    entry = registry.get("draft-head")
    assert entry is not None and entry.requires_draft_head is True
    assert entry.plugin == "draft-head" and entry.package == "tsspec-draft-head"
    assert "per-token" in entry.description


def test_factory_declines_without_a_per_token_head():
    with pytest.raises(SpeculatorDeclined, match="no per-token draft head"):
        make_draft_head(_toy(head=False), SpeculationOptions())
    target = _toy(head=False)
    target.draft_head = BlockHead()
    with pytest.raises(SpeculatorDeclined, match="block"):
        make_draft_head(target, SpeculationOptions())


def test_registry_reasons(registry):
    decline = registry.create(_toy(head=False), SpeculationOptions(spec_type="draft-head"))
    assert decline.code == NO_DRAFT_HEAD
    target = _toy(head=False)
    target.draft_head = BlockHead()
    decline = registry.create(target, SpeculationOptions(spec_type="draft-head"))
    assert decline.code == CANNOT_SERVE and "block" in decline.reason


def test_auto_picks_draft_head_for_a_per_token_checkpoint(registry):
    made = registry.create(_toy(), SpeculationOptions())
    assert isinstance(made, DraftHeadSpeculator) and made.name == "draft-head"


def test_pmin_comes_from_options_and_the_window_from_the_loop():
    from tsspec.runtime.generation import draft_window

    target = _toy()
    spec = make_draft_head(target, SpeculationOptions())
    assert spec.min_draft_prob == 0.75 and draft_window(SpeculationOptions(), target, spec) == 8
    target.spec_preferred_draft_window = 3
    assert draft_window(SpeculationOptions(), target, make_draft_head(target, SpeculationOptions())) == 3
    spec = make_draft_head(target, SpeculationOptions(draft=6, pmin=0.2))
    assert spec.min_draft_prob == 0.2 and draft_window(SpeculationOptions(draft=6), target, spec) == 6
    assert spec.feature_size == target.spec_feature_size


def test_generate_through_the_registry(registry):
    options = SpeculationOptions(adaptive=False, spec_type="draft-head", pmin=0.0)
    gen = generate(_toy(), "hello there", options, max_tokens=12, registry=registry)
    plain = generate(_toy(), "hello there", SpeculationOptions(enabled=False), max_tokens=12)
    assert gen.speculator == "draft-head" and gen.decline is None
    assert gen.tokens == plain.tokens and gen.stats.draft_tokens > 0


def test_the_plugin_declares_the_switches_it_reads():
    from tsspec.testing import plugin_catalog

    import tsspec_draft_head
    from tsspec_draft_head.native_head import ONE_CALL_ENV, THREAD_CHOICE_ENV
    from tsspec_draft_head.nextn_file import NATIVE_ENV
    from tsspec_draft_head.speculator import FOLD_ENV, fold_enabled

    assert set(tsspec_draft_head.plugin.SWITCHES) == {FOLD_ENV, NATIVE_ENV, ONE_CALL_ENV, THREAD_CHOICE_ENV}
    catalog = plugin_catalog({"draft-head": tsspec_draft_head})
    assert set(catalog.switches) == set(tsspec_draft_head.plugin.SWITCHES)
    assert fold_enabled({FOLD_ENV: "no"}) is False and fold_enabled({}) is True
