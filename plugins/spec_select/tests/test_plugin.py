"""The plugin as the registry sees it: auto hands it the pair's members; asked by name it
declines; a composer that fails leaves the fixed pair, said in the log."""

from __future__ import annotations

import importlib.metadata as metadata
import logging

import tsspec_select
from tsspec.protocols import DraftHeadKind
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.pairing import SpeculatorPair
from tsspec.runtime.registry import Decline, SpeculatorRegistry
from tsspec.testing import SilentSpeculator as Named, ToyTarget
from tsspec_select import MeasuredChoice


class FallbackHead:
    kind = DraftHeadKind.PER_TOKEN
    auto_fallback = True


def _registry(composer=tsspec_select.tsspec_register_speculators):
    reg = SpeculatorRegistry()
    reg.register("ngram", lambda t, o: Named("ngram"), requires_draft_head=False, weight_free=True)
    reg.register("draft-head", lambda t, o: Named("draft-head"), requires_draft_head=True,
                 serves_kind=DraftHeadKind.PER_TOKEN)
    composer(reg.register)
    return reg


def test_entry_point_names_the_module():
    eps = [ep for ep in metadata.entry_points(group="tsspec") if ep.name == "select"]
    assert len(eps) == 1 and eps[0].value == "tsspec_select"


def test_auto_composes_the_pair_it_would_have_made():
    target = ToyTarget()
    target.draft_head = FallbackHead()
    reg = _registry()
    made = reg.create(target, SpeculationOptions(spec_type="auto"))
    assert isinstance(made, MeasuredChoice) and list(made.members) == ["ngram", "draft-head"]
    assert made.candidates == ["ngram+draft-head", "ngram", "draft-head", "plain"]
    assert reg.auto_plan(target) == "select(ngram+draft-head)"
    # the memory is the registry's, per target: the bench's forget() clears it
    made.close()
    assert reg.memory(target, "auto") is made.memory and "gain" in made.memory
    reg.forget(target)
    assert reg.memory(target, "auto") == {}
    # without a fallback head auto is the weight-free algorithm alone, as before
    assert reg.create(ToyTarget(), SpeculationOptions(spec_type="auto")).name == "ngram"


def test_asked_by_name_it_declines():
    target = ToyTarget()
    target.draft_head = FallbackHead()
    made = _registry().create(target, SpeculationOptions(spec_type="select"))
    assert isinstance(made, Decline) and made.code == "cannot_serve" and "--spec-type auto" in made.reason


def test_a_failing_composer_leaves_the_pair_and_says_so(caplog):
    def broken(register):
        register("broken", lambda t, o, members=None, memory=None: 1 / 0, requires_draft_head=True, composes_auto=True)

    target = ToyTarget()
    target.draft_head = FallbackHead()
    with caplog.at_level(logging.WARNING, logger="tsspec.registry"):
        made = _registry(broken).create(target, SpeculationOptions(spec_type="auto"))
    assert isinstance(made, SpeculatorPair) and "composer broken" in caplog.text


def test_the_plugin_host_takes_the_registration():
    """Through the plugin host (as installed plugins load), not only the bare registry."""
    from tsspec.hookspecs import hookimpl
    from tsspec.testing import plugin_catalog

    class Algorithms:
        @hookimpl
        def tsspec_register_speculators(self, register):
            register("ngram", lambda t, o: Named("ngram"), requires_draft_head=False, weight_free=True)
            register("draft-head", lambda t, o: Named("draft-head"), requires_draft_head=True,
                     serves_kind=DraftHeadKind.PER_TOKEN)

    catalog = plugin_catalog({"algorithms": Algorithms(), "select": tsspec_select})
    assert catalog.speculators.get("select").composes_auto
    target = ToyTarget()
    target.draft_head = FallbackHead()
    assert isinstance(catalog.speculators.create(target, SpeculationOptions(spec_type="auto")), MeasuredChoice)
