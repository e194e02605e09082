"""tsspec_training.blocks: anchors, label windows, batches, default taps, the mask token."""

from __future__ import annotations

import torch

from tsspec_training import blocks
from tsspec_training.teacher import TeacherSequence


def _seq(tokens, labels, width=3):
    n = len(tokens)
    return TeacherSequence("t", torch.tensor(tokens), torch.arange(n * width, dtype=torch.float16).view(n, width),
                           torch.tensor(labels))


def test_block_labels_are_the_target_argmax_shifted_by_the_anchor():
    labels = torch.tensor([10, 11, 12, 13, 14, 15])
    out = blocks.block_labels(labels, torch.tensor([1, 4]), block_size=4)
    # anchor 1: rows 1..3 predict positions 2..4 = labels[1..3]; anchor 4 runs past the end
    assert out.tolist() == [[11, 12, 13], [14, 15, blocks.IGNORE]]


def test_sample_anchors_is_seeded_distinct_and_in_range():
    a = blocks.sample_anchors(20, 6, torch.Generator().manual_seed(3))
    b = blocks.sample_anchors(20, 6, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.numel() == 6 and len(set(a.tolist())) == 6
    assert int(a.min()) >= 1 and int(a.max()) <= 18
    assert blocks.sample_anchors(2, 4, torch.Generator()).numel() == 0  # no position has context and a label
    assert blocks.sample_anchors(5, 10, torch.Generator()).tolist() == [1, 2, 3]


def test_make_batch_pads_and_marks_padding_anchors():
    long = _seq([1, 2, 3, 4, 5, 6], [2, 3, 4, 5, 6, 7])
    short = _seq([1, 2, 3], [9, 9, 9])
    batch = blocks.make_batch([long, short], block_size=3, anchors_per_sequence=4, generator=None)
    # evaluation anchors: every position from 1 whose whole window is labelled
    assert batch.anchors[0].tolist() == [1, 2, 3, 4] and batch.anchor_ok[0].all()
    assert batch.anchor_ok[1].tolist() == [True, False, False, False]
    assert batch.labels[0, 0].tolist() == [3, 4] and batch.labels[1, 1].tolist() == [blocks.IGNORE] * 2
    assert batch.features.shape == (2, 6, 3) and batch.features[1, 3:].abs().sum() == 0
    assert batch.tokens[0].tolist() == [1, 2, 3, 4, 5, 6]


def test_default_taps_spread_over_depth_in_the_entering_convention():
    assert blocks.default_taps(30) == (2, 15, 28)
    assert blocks.default_taps(2) == (1, 2)
    assert blocks.default_taps(1) == (1,)
    assert all(0 <= t <= 4 for t in blocks.default_taps(4))


def test_position_weights_decay_and_expected_accepted():
    w = blocks.position_weights(4, 1.0)
    assert w[0] == 1.0 and torch.all(w[1:] < w[:-1])
    assert torch.equal(blocks.position_weights(4, None), torch.ones(3))
    hits = torch.tensor([[True, True, False], [False, True, True]])
    assert blocks.expected_accepted(hits) == 1.0  # a block counts until its first miss


def test_least_used_token_avoids_the_data():
    data = [_seq([0, 1, 2, 3], [1, 2, 3, 0])]
    assert blocks.least_used_token(data, 6) == 4
    assert blocks.least_used_token(data, 6, candidates=[5]) == 5
