"""Attaching a DFlash file: fit checks with clear reasons, taps, head replacement, registry and
loader paths. Bad input is found at attach time, never mid-generation."""

from __future__ import annotations

import pytest

from tsspec.errors import ModelLoadError
from tsspec.protocols import DraftHeadKind
from tsspec.runtime.catalog import Catalog, LoaderEntry
from tsspec.runtime.loading import load_model
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.registry import CANNOT_SERVE, Decline, SpeculatorRegistry
from tsspec.testing import ToyTarget
from tsspec_model_toy.heads import ToyPerTokenHead

import tsspec_block
from tsspec_block.attach import attach_dflash
from tsspec_block.head import DFlashDraftHead
from tsspec_block.speculator import BlockDraftSpeculator

GOOD = dict(hidden_size=16, target_layers=[1, 2], mask_token_id=31, num_layers=1, block_size=5, sliding_window=8)


@pytest.mark.parametrize(
    "over, message",
    [
        (dict(hidden_size=8), "target_hidden_size is 8 but the target's hidden size is 16"),
        (dict(target_hidden_size=12), "target_hidden_size is 12"),
        (dict(target_layers=[1, 3]), "reach layer 3, but the target has 2 layers"),
        (dict(vocab_size=40), "vocabulary (40 tokens) does not match the target's (32)"),
        (dict(mask_token_id=32), "mask token id 32 is outside"),
        (dict(selector=(2, 3), vocab_size=None, selector_vocab=40), "selector codebooks cover 40"),
    ],
)
def test_misfit_drafters_fail_with_a_reason_and_leave_the_target_alone(tmp_path, drafter_file, over, message):
    path = drafter_file(tmp_path / "d.gguf", **{**GOOD, **over})
    target = ToyTarget()
    with pytest.raises(ModelLoadError) as info:
        attach_dflash(target, path)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert target.draft_head is None and target.spec_feature_size == 16  # no taps set


def test_target_without_the_borrowed_surface(tmp_path, drafter_file):
    path = drafter_file(tmp_path / "d.gguf", **GOOD)
    target = ToyTarget()
    target.lm_head = None
    with pytest.raises(ModelLoadError, match="does not expose lm_head"):
        attach_dflash(target, path)


def test_attach_sets_taps_and_replaces_a_per_token_head(tmp_path, drafter_file):
    path = drafter_file(tmp_path / "d.gguf", **GOOD)
    target = ToyTarget()
    target.draft_head = ToyPerTokenHead(32, 16)
    head = attach_dflash(target, path)
    assert isinstance(head, DFlashDraftHead) and target.draft_head is head
    assert head.kind is DraftHeadKind.BLOCK and head.resumes_after_gap
    assert target.spec_feature_size == 32 and head.feature_size == 32
    assert head.dtype.is_floating_point and str(head.dtype) == "torch.float64"  # follows the toy target


def test_registry_turns_a_misfit_into_a_cannot_serve_decline(tmp_path, drafter_file):
    bad = drafter_file(tmp_path / "bad.gguf", **{**GOOD, "target_layers": [1, 9]})
    registry = SpeculatorRegistry()
    tsspec_block.tsspec_register_speculators(registry.register)
    entry = registry.get("block")
    assert entry.requires_draft_head
    target = ToyTarget()
    decline = registry.create(target, SpeculationOptions(spec_type="block", draft_model=str(bad)))
    assert isinstance(decline, Decline) and decline.code == CANNOT_SERVE
    assert "reach layer 9" in decline.reason and "bad.gguf" in decline.reason
    good = drafter_file(tmp_path / "good.gguf", **GOOD)
    made = registry.create(ToyTarget(), SpeculationOptions(spec_type="block", draft_model=str(good)))
    assert isinstance(made, BlockDraftSpeculator)


def test_auto_picks_block_once_a_dflash_file_is_attached(tmp_path, drafter_file):
    registry = SpeculatorRegistry()
    tsspec_block.tsspec_register_speculators(registry.register)
    target = ToyTarget()
    attach_dflash(target, drafter_file(tmp_path / "d.gguf", **GOOD))
    assert isinstance(registry.create(target, SpeculationOptions()), BlockDraftSpeculator)


def test_loader_path_attaches_by_architecture_and_fails_in_one_line(tmp_path, drafter_file):
    catalog = Catalog()
    # the file-less toy model, as the toy plugin registers it
    catalog.models["toy"] = LoaderEntry(["toy"], lambda name, options: ToyTarget(), "toy", file_less=True)
    registered = {}
    tsspec_block.tsspec_register_drafters(lambda archs, fn: registered.update({a: fn for a in archs}))
    assert set(registered) == {"dflash", "dflash-draft"}
    for arch, fn in registered.items():
        catalog.drafters[arch] = LoaderEntry([arch], fn, "block")
    target = load_model("toy", draft_model=str(drafter_file(tmp_path / "d.gguf", **GOOD)), catalog=catalog)
    assert isinstance(target.draft_head, DFlashDraftHead)
    bad = drafter_file(tmp_path / "bad.gguf", **{**GOOD, "hidden_size": 8})
    with pytest.raises(ModelLoadError) as info:
        load_model("toy", draft_model=str(bad), catalog=catalog)
    assert "bad.gguf" in str(info.value) and "\n" not in str(info.value)


def test_hyper_connection_file_goes_to_a_target_that_binds_it(tmp_path):
    """dflash.hyper_connection.count > 0 is a DSpark drafter for a hyper-connection model: a
    target without ``attach_drafter_file`` refuses it clearly; one with it binds it."""
    import pytest

    from tsspec.errors import ModelLoadError
    from tsspec_gguf.gguf_writer_util import write_gguf
    from tsspec.testing import ToyTarget
    from tsspec_block.attach import attach_dflash

    path = write_gguf(tmp_path / "dspark.gguf", "dflash", {"dflash.hyper_connection.count": 4}, {})
    with pytest.raises(ModelLoadError, match="hyper_connection.count = 4"):
        attach_dflash(ToyTarget(), path)

    class Binds(ToyTarget):
        def attach_drafter_file(self, p, options=None):
            return ("bound", p)

    assert attach_dflash(Binds(), path) == ("bound", path)


def test_the_plugin_declares_the_switches_it_reads():
    from tsspec.testing import plugin_catalog

    import tsspec_block
    from tsspec_block.attach import CONV_ENV, SELECTOR_ENV, extension_enabled
    from tsspec_block.head import NATIVE_ENV

    assert set(tsspec_block.SWITCHES) == {CONV_ENV, SELECTOR_ENV, NATIVE_ENV}
    assert set(plugin_catalog({"block": tsspec_block}).switches) == set(tsspec_block.SWITCHES)
    assert extension_enabled(SELECTOR_ENV, {SELECTOR_ENV: "no"}) is False
