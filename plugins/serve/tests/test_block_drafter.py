"""The shipped block drafter (tsspec-drafters-smollm2's DFlash head) served to several clients at
once: each request drafts from its own context (the ``block`` algorithm drives a view of the one
head per sequence), so its output equals plain decoding and its drafts equal the same request
served alone, greedy and seeded, through the official client."""

from __future__ import annotations

import pytest

from tsspec.runtime.options import SpeculationOptions

pytest.importorskip("openai")
drafters = pytest.importorskip("tsspec_drafters_smollm2")
pytest.importorskip("tsspec_block")

DFLASH_FILE = drafters.HERE / "smollm2-135m-instruct-dflash.gguf"
# the governor off (its parks follow measured step times, which concurrency changes) and no
# confidence floor: every request drafts every step, so the views are exercised throughout
OPTIONS = SpeculationOptions(spec_type="block", adaptive=False, pmin=0.0)


@pytest.fixture(scope="module")
def drafted_target(embedded_target):
    """The embedded model with the shipped DFlash drafter attached (its feature taps set), put
    back as it was afterwards."""
    from tsspec_block.attach import attach_dflash

    if not DFLASH_FILE.is_file():
        pytest.skip("the shipped DFlash drafter is not in this install")
    previous, taps = embedded_target.draft_head, embedded_target.feature_taps
    attach_dflash(embedded_target, DFLASH_FILE)
    yield embedded_target
    embedded_target.draft_head = previous
    embedded_target.spec_set_feature_taps(taps)


def test_concurrent_requests_on_the_block_drafter_equal_plain_decoding(drafted_target, served_alone_and_together):
    import tsspec_block

    served_alone_and_together(drafted_target, tsspec_block, OPTIONS, "block", seed=200)
