"""ConfidenceCalibration and ChainWorth on tiny hand-made evidence: buckets, the isotonic
order, the prior replaced by what lands, and the length / extension decisions against costs."""

import math

import pytest

from tsspec.runtime.calibration import (
    BUCKETS,
    ChainWorth,
    ConfidenceCalibration,
    StepCosts,
    bucket,
    valid_confidences,
)

# forward cost by rows as a target publishes it: 2 rows 1.2x one row, 3 rows 1.4x, ...
SHAPE = ((1, 10.0), (2, 12.0), (3, 14.0), (4, 16.0), (8, 24.0))


def _economics(plain_ms=10.0):
    costs = StepCosts(SHAPE)
    for _ in range(4):
        costs.record(0, plain_ms)
    return costs


def _calibrated(sure=0.95, unsure=0.05, steps=40):
    """Tokens of confidence ~0.9 land ``sure`` of the time, ~0.3 ``unsure`` of the time."""
    calibration = ConfidenceCalibration()
    for i in range(steps):
        calibration.record([0.92], 1 if (i % 100) < sure * 100 else 0)
        calibration.record([0.31], 1 if (i % 100) < unsure * 100 else 0)
    return calibration


def test_buckets_cover_zero_to_one():
    assert [bucket(c) for c in (0.0, 0.099, 0.1, 0.55, 0.999, 1.0)] == [0, 0, 1, 5, 9, 9]
    assert bucket(-3) == 0 and bucket(7) == BUCKETS - 1


def test_valid_confidences_refuses_what_is_not_one_probability_per_draft():
    assert valid_confidences((0.2, 1), 2) == [0.2, 1.0]
    for bad in ([0.2], [0.2, 1.5], [0.2, -0.1], [0.2, math.nan], "ab", [True, 0.5], None, [object(), 1]):
        assert valid_confidences(bad, 2) is None


def test_a_verify_counts_the_positions_it_judged():
    calibration = ConfidenceCalibration()
    calibration.record([0.95, 0.55, 0.15], 1)  # the first landed, the second missed, the third unjudged
    assert calibration.reached[9] == 1 and calibration.landed[9] == 1
    assert calibration.reached[5] == 1 and calibration.landed[5] == 0
    assert calibration.reached[1] == 0
    calibration.record([0.15], 0)
    assert calibration.reached[1] == 1 and calibration.samples() == 3


def test_without_evidence_a_confidence_means_what_the_drafter_claims():
    table = ConfidenceCalibration().table()
    assert table == pytest.approx([(b + 0.5) / BUCKETS for b in range(BUCKETS)])


def test_the_runs_evidence_replaces_the_prior():
    calibration = ConfidenceCalibration()
    for _ in range(30):
        calibration.record([0.85], 0)  # a head that claims 0.85 and is always wrong here
    # pooled with the less sure buckets above its measure, whose claims it contradicts
    assert calibration.chance(0.85) < 0.2 and calibration.chance(0.55) <= calibration.chance(0.85)
    calibration.clear()
    assert calibration.chance(0.85) == pytest.approx(0.85)


def test_a_bad_low_bucket_does_not_drag_a_good_high_one():
    calibration = _calibrated(sure=1.0, unsure=0.0, steps=60)
    assert calibration.chance(0.92) > 0.95 and calibration.chance(0.31) < 0.05


def test_landing_stays_ordered_by_confidence():
    calibration = ConfidenceCalibration()
    for _ in range(20):
        calibration.record([0.85], 0)  # the sure bucket misses...
        calibration.record([0.45], 1)  # ...and a less sure one lands: pooled, not inverted
    table = calibration.table()
    assert all(a <= b + 1e-12 for a, b in zip(table, table[1:]))
    assert calibration.chance(0.85) == pytest.approx(calibration.chance(0.45))


def test_length_verifies_what_pays_and_declines_what_does_not():
    worth = ChainWorth(_calibrated(), _economics())
    assert worth.length([0.92, 0.92, 0.92]) == 3  # ~0.95 each: E(3) 3.7 tokens for 1.6 steps
    assert worth.length([0.31]) == 0  # ~0.05: 1.05 tokens for 1.2 steps loses to a plain step
    assert worth.length([0.92, 0.31]) == 1  # the unsure second token does not pay its row


def test_length_follows_the_measured_row_cost():
    calibration = ConfidenceCalibration()
    for i in range(40):
        calibration.record([0.31], 1 if i % 10 < 3 else 0)  # lands ~0.3 of the time
    cheap = ChainWorth(calibration, _economics())  # a row costs 0.2 of a step: 0.3 pays
    steep = StepCosts(((1, 10.0), (2, 16.0), (3, 22.0)))  # a row costs 0.6 of a step
    for _ in range(4):
        steep.record(0, 10.0)
    assert cheap.length([0.31]) == 1 and ChainWorth(calibration, steep).length([0.31]) == 0


def test_with_nothing_measured_a_chain_is_tried():
    worth = ChainWorth(ConfidenceCalibration(), StepCosts(SHAPE))
    assert worth.length([0.2, 0.1]) == 2


def test_step_costs_interpolate_without_a_shape_and_scale_the_shape_by_the_median_step():
    costs = StepCosts()
    costs.record(0, 10.0)
    assert costs.costs(2) == [10.0, 10.0, 10.0]  # one measured length: flat
    costs.record(2, 14.0)
    assert costs.costs(3) == [10.0, 12.0, 14.0, 16.0]  # between and past the measured lengths
    costs.set_shape(SHAPE)  # the samples so far are re-read against the shape: scale 1.0
    assert costs.costs(2) == pytest.approx([10.0, 12.0, 14.0])
    costs.record(1, 1e6)  # one slow step moves no price: the median absorbs it
    assert costs.costs(1) == pytest.approx([10.0, 12.0])
    assert StepCosts(((1, 10.0), (2, 9.0))).shape is None  # a falling profile is not used
