"""SpeculatorRegistry: every decline code reachable with its sentence, auto resolution,
windows and pmin defaults."""

import pytest

from tsspec.protocols import DraftHeadKind, SpeculatorDeclined
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.registry import (
    CANNOT_SERVE,
    DECLINE_CODES,
    NO_DRAFT_HEAD,
    PLUGIN_ERROR,
    REFUSED,
    UNKNOWN_ALGORITHM,
    UNPROFITABLE,
    Decline,
    SpeculatorRegistry,
)
from tsspec.testing import SilentSpeculator as Named, ToyTarget


class Head:
    def __init__(self, kind):
        self.kind = kind


def make_registry():
    reg = SpeculatorRegistry()
    reg.register("ngram", lambda t, o: Named("an ngram speculator"), requires_draft_head=False,
                 weight_free=True, plugin="ngram")
    reg.register("draft-head", lambda t, o: Named("a head speculator"), requires_draft_head=True,
                 serves_kind=DraftHeadKind.PER_TOKEN, plugin="draft-head")
    reg.register("block", lambda t, o: Named("a block speculator"), requires_draft_head=True,
                 serves_kind=DraftHeadKind.BLOCK, plugin="block")
    return reg


def opts(name="auto", **kw):
    return SpeculationOptions(spec_type=name, **kw)


def test_auto_follows_the_checkpoint_drafter():
    reg = make_registry()
    target = ToyTarget()
    assert reg.resolve_name(target, "auto") == "ngram"  # no drafter: the weight-free one
    target.draft_head = Head(DraftHeadKind.PER_TOKEN)
    assert reg.create(target, opts()) == Named("a head speculator")
    target.draft_head = Head(DraftHeadKind.BLOCK)
    assert reg.create(target, opts()) == Named("a block speculator")


def test_refused_outranks_everything():
    reg = make_registry()
    target = ToyTarget()
    target.speculation_refusal = "the fused kernel is not built"
    for name in ("auto", "ngram", "nonexistent", "draft-head"):
        d = reg.create(target, opts(name))
        assert isinstance(d, Decline) and d.code == REFUSED and "fused kernel" in d.reason


def test_unknown_algorithm_lists_known_names():
    d = make_registry().create(ToyTarget(), opts("medusa"))
    assert d.code == UNKNOWN_ALGORITHM
    assert "auto, block, draft-head, ngram" in d.reason


def test_no_draft_head_names_the_weight_free_alternative():
    d = make_registry().create(ToyTarget(), opts("draft-head"))
    assert d.code == NO_DRAFT_HEAD and "--spec-type ngram" in d.reason
    # a drafter file named by the operator lets the factory decide instead
    assert make_registry().create(ToyTarget(), opts("block", draft_model="x.gguf")) == Named("a block speculator")


def test_no_draft_head_quotes_why_the_target_carries_none():
    target = ToyTarget()
    target.spec_draft_head_absence = "the file's NextN layer was not loaded: speculation is off"
    d = make_registry().create(target, opts("draft-head"))
    assert d.code == NO_DRAFT_HEAD and "carries none (the file's NextN layer was not loaded" in d.reason


def test_auto_without_any_drafter_or_weight_free_algorithm():
    reg = SpeculatorRegistry()
    d = reg.create(ToyTarget(), opts())
    assert d.code == NO_DRAFT_HEAD and "auto" in d.reason


def test_unprofitable_without_own_drafter():
    target = ToyTarget()
    target.speculation_profitable = False
    d = make_registry().create(target, opts("ngram"))
    assert d.code == UNPROFITABLE and "not profitable" in d.reason


def test_cannot_serve_and_plugin_error():
    reg = SpeculatorRegistry()

    def declines(t, o):
        raise SpeculatorDeclined("no Medusa file attached")

    def broken(t, o):
        raise KeyError("boom")

    reg.register("a", declines, requires_draft_head=False, plugin="pa")
    reg.register("b", lambda t, o: None, requires_draft_head=False, plugin="pb")
    reg.register("c", broken, requires_draft_head=False, plugin="pc")
    d = reg.create(ToyTarget(), opts("a"))
    assert d.code == CANNOT_SERVE and "no Medusa file attached" in d.reason
    d = reg.create(ToyTarget(), opts("b"))
    assert d.code == CANNOT_SERVE and "declined" in d.reason
    d = reg.create(ToyTarget(), opts("c"))
    assert d.code == PLUGIN_ERROR and "pc" in d.reason and "KeyError" in d.reason


def test_every_code_is_tested_here():
    assert set(DECLINE_CODES) == {REFUSED, UNPROFITABLE, NO_DRAFT_HEAD, UNKNOWN_ALGORITHM, CANNOT_SERVE, PLUGIN_ERROR}


def test_registration_rules():
    reg = make_registry()
    with pytest.raises(ValueError, match="reserved"):
        reg.register("auto", lambda t, o: None, requires_draft_head=False)
    with pytest.raises(TypeError):
        reg.register("x", "not callable", requires_draft_head=False)
    reg.register("ngram", lambda t, o: Named("second"), requires_draft_head=False, plugin="other")
    assert reg.create(ToyTarget(), opts("ngram")) == Named("an ngram speculator")  # first one kept
    assert reg.conflicts and "other" in reg.conflicts[0]
    with pytest.raises(TypeError, match="default_pmin"):  # the gate's default is the speculator's
        reg.register("y", lambda t, o: None, requires_draft_head=False, default_pmin=0.5)
    with pytest.raises(TypeError, match="serves_kind"):
        reg.register("y", lambda t, o: None, requires_draft_head=True, serves_kind="block")


def test_factory_returning_a_non_speculator_is_a_plugin_error():
    reg = SpeculatorRegistry()
    reg.register("odd", lambda t, o: "a string", requires_draft_head=False, plugin="podd")
    d = reg.create(ToyTarget(), opts("odd"))
    assert d.code == PLUGIN_ERROR and "not a speculator" in d.reason


def test_auto_and_declines_name_only_what_is_registered():
    """No algorithm is named by the core: with a third-party weight-free algorithm alone, auto
    picks it and decline sentences suggest it; with none, they say none is installed."""
    reg = SpeculatorRegistry()
    reg.register("bigram", lambda t, o: Named("bigram"), requires_draft_head=False, plugin="third")
    reg.register("heads", lambda t, o: Named("heads"), requires_draft_head=True, plugin="third")
    target = ToyTarget()
    assert reg.weight_free() == ["bigram"] and reg.resolve_name(target, "auto") == "bigram"
    d = reg.create(target, opts("heads"))
    assert d.code == NO_DRAFT_HEAD and "--spec-type bigram" in d.reason and "ngram" not in d.reason
    target.draft_head = Head(DraftHeadKind.PER_TOKEN)  # a drafter no installed algorithm serves
    assert reg.resolve_name(target, "auto") == "bigram"
    empty = SpeculatorRegistry()
    empty.register("heads", lambda t, o: Named("heads"), requires_draft_head=True)
    d = empty.create(ToyTarget(), opts("heads"))
    assert d.code == NO_DRAFT_HEAD and "no weight-free algorithm is installed" in d.reason
    d = empty.create(ToyTarget(), opts())
    assert d.code == NO_DRAFT_HEAD and "none is installed" in d.reason and "ngram" not in d.reason


def test_auto_prefers_the_declared_priority_then_the_name():
    reg = SpeculatorRegistry()
    for name, priority in (("aaa", 0), ("zzz", 5), ("mmm", 5)):
        reg.register(name, lambda t, o: Named(name), requires_draft_head=False, auto_priority=priority)
    assert reg.weight_free() == ["mmm", "zzz", "aaa"]
    assert reg.resolve_name(ToyTarget(), "auto") == "mmm"


def test_evaluate_reports_every_registration():
    rows = {r["name"]: r for r in make_registry().evaluate(ToyTarget(), opts())}
    assert rows["ngram"]["status"] == "serves" and rows["ngram"]["plugin"] == "ngram"
    assert rows["draft-head"]["code"] == NO_DRAFT_HEAD and rows["draft-head"]["requires_draft_head"]
    listed = {r["name"]: r["status"] for r in make_registry().evaluate(None, opts())}
    assert set(listed.values()) == {"registered"}
