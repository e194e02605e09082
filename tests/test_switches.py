"""The attribution switches: one parser, one list."""

from __future__ import annotations

import pytest

from tsspec.switches import OFF_WORDS, SWITCHES, describe, switch_on


@pytest.mark.parametrize("value", ["0", "false", "No", " off ", "OFF"])
def test_off_words_turn_a_switch_off(value):
    assert switch_on("TS_DFLASH_CONV", {"TS_DFLASH_CONV": value}) is False


@pytest.mark.parametrize("value", [None, "", "1", "yes", "anything"])
def test_anything_else_leaves_it_on(value):
    env = {} if value is None else {"TS_DFLASH_CONV": value}
    assert switch_on("TS_DFLASH_CONV", env) is True


def test_every_switch_is_listed_and_described():
    assert set(SWITCHES) == {"TS_Q35_VERIFY_SNAPSHOTS", "TS_MTP_FOLD_CATCHUP", "TS_DFLASH_CONV", "TS_DFLASH_SELECTOR",
                             "TS_MTP_NATIVE", "TS_MTP_ONE_CALL", "TS_MTP_THREAD_CHOICE", "TS_DFLASH_NATIVE"}
    assert all(f"{name}=0" in describe() for name in SWITCHES)
    assert "0" in OFF_WORDS


def test_plugins_read_their_switch_through_the_one_parser():
    from tsspec_block.attach import extension_enabled
    from tsspec_draft_head.speculator import fold_enabled
    from tsspec_model_qwen35.target import snapshots_enabled

    for read, name in ((extension_enabled, None), (fold_enabled, "TS_MTP_FOLD_CATCHUP"),
                       (snapshots_enabled, "TS_Q35_VERIFY_SNAPSHOTS")):
        if name is None:
            assert read("TS_DFLASH_SELECTOR", {"TS_DFLASH_SELECTOR": "no"}) is False
        else:
            assert read({name: "no"}) is False and read({}) is True
