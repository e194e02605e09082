"""The helpers tsspec.protocols offers model plugins and factories."""

from __future__ import annotations

import pytest

import tsspec
from tsspec.testing import ToyTarget


def test_resolve_feature_taps():
    assert tsspec.resolve_feature_taps([2, 0, 3], 3) == (2, 0, 3)  # order kept: the concatenation order
    assert tsspec.resolve_feature_taps(None, 3) is None and tsspec.resolve_feature_taps([], 3) is None
    with pytest.raises(ValueError, match=r"layer ids in 0\.\.3, got \[1, 4\]"):
        tsspec.resolve_feature_taps([1, 4], 3)


def test_toy_target_taps_and_width_check():
    target = ToyTarget()
    target.spec_set_feature_taps([0, 2])
    assert target.spec_feature_size == 2 * target.config.hidden_size
    with pytest.raises(tsspec.SpeculatorDeclined, match="reads 16"):
        tsspec.require_feature_width(target, 16, "a drafter")
    target.spec_set_feature_taps(None)
    tsspec.require_feature_width(target, target.config.hidden_size, "a drafter")
    with pytest.raises(ValueError, match="feature taps"):
        target.spec_set_feature_taps([3])
