"""DFlashDraftHead bookkeeping: rewinds, gaps, absent rows, windows, and its protocol surface."""

from __future__ import annotations

import pytest
import torch

from tsspec.testing import ToyTarget

from tsspec_block.attach import attach_dflash

BASE = dict(hidden_size=16, target_layers=[1, 2], mask_token_id=31, num_layers=2, block_size=5)


def _pair(tmp_path, drafter_file, **over):
    path = drafter_file(tmp_path / "d.gguf", **{**BASE, "sliding_window": 6, **over})

    def fresh():
        target = ToyTarget()
        return target, attach_dflash(target, path)

    return fresh


def _features(target, ids):
    _, feats = target.spec_forward(ids, all_logits_rows=True, want_hidden=True)
    return feats  # [n, 32]


def _same(a, b):
    """Equal up to the last bits a different row batching gives a matmul."""
    return torch.allclose(a, b, atol=1e-12, rtol=0)


def _fed(fresh, feats, start, end):
    """A fresh head that knows exactly positions start..end-1."""
    _, head = fresh()
    head.inject_rows(torch.arange(start, end), feats[start:end])
    return head


def test_rewind_overwrites_the_old_sequence(tmp_path, drafter_file):
    fresh = _pair(tmp_path, drafter_file)
    target, head = fresh()
    a = _features(target, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
    head.draft_catch_up(list(range(12)), torch.cat([torch.zeros(1, 32, dtype=torch.float64), a[:11]]), 0)
    target.spec_rewind_cache(0)
    b = _features(target, [7, 7, 2, 9])
    head.draft_catch_up([7, 7, 2, 9], torch.cat([torch.zeros(1, 32, dtype=torch.float64), b[:3]]), 0)
    ref = _fed(fresh, b, 0, 3)
    assert _same(head.block_hidden(9, 3), ref.block_hidden(9, 3))  # nothing of A leaks in


def test_gap_only_shortens_the_context(tmp_path, drafter_file):
    fresh = _pair(tmp_path, drafter_file)
    target, head = fresh()
    feats = _features(target, list(range(1, 25)))
    head.draft_catch_up(list(range(4)), feats[9:13], 10)  # rows of positions 9..12, nothing before
    ref = _fed(fresh, feats, 9, 13)
    assert _same(head.block_hidden(5, 13), ref.block_hidden(5, 13))
    head.draft_catch_up([1, 2], None, 13)  # rows withheld: positions from 12 on are forgotten
    ref = _fed(fresh, feats, 9, 12)
    assert _same(head.block_hidden(5, 13), ref.block_hidden(5, 13))


def test_all_zero_row_is_an_absent_row(tmp_path, drafter_file):
    fresh = _pair(tmp_path, drafter_file)
    target, head = fresh()
    feats = _features(target, list(range(1, 9)))
    rows = feats[3:7].clone()
    rows[0] = 0.0  # the loop's stand-in for the last row of a reused prefix
    head.draft_catch_up([1, 2, 3, 4], rows, 4)
    ref = _fed(fresh, feats, 4, 7)
    assert _same(head.block_hidden(2, 8), ref.block_hidden(2, 8))


@pytest.mark.parametrize("window, pattern", [(None, None), (3, [True, False])])
def test_full_attention_layers_keep_the_whole_context(tmp_path, drafter_file, window, pattern):
    extra = {"dflash.attention.sliding_window_pattern": pattern} if pattern else None
    path = drafter_file(tmp_path / "d.gguf", **{**BASE, "sliding_window": window}, extra=extra)
    target = ToyTarget()
    head = attach_dflash(target, path)
    assert head._stores[1].ring is False and head._stores[0].ring is (window is not None)
    feats = _features(target, [i % 31 for i in range(1, 40)])
    head.inject_rows(torch.arange(0, 39), feats)
    far = head.block_hidden(4, 39)
    head.inject_rows(torch.tensor([0]), feats[5:6])  # change a position far outside any window
    assert not _same(far, head.block_hidden(4, 39))  # a full layer still sees position 0


def test_sliding_window_hides_old_positions(tmp_path, drafter_file):
    fresh = _pair(tmp_path, drafter_file)
    target, head = fresh()
    feats = _features(target, [i % 31 for i in range(1, 30)])
    head.inject_rows(torch.arange(0, 29), feats)
    ref = _fed(fresh, feats, 29 - 6, 29)  # the window is 6: row 0 at 29 sees 23..28
    assert _same(head.block_hidden(4, 29), ref.block_hidden(4, 29))


def test_draft_outputs_and_width_check(tmp_path, drafter_file):
    fresh = _pair(tmp_path, drafter_file)
    target, head = fresh()
    feats = _features(target, list(range(1, 10)))
    head.inject_rows(torch.arange(0, 8), feats[:8])
    tokens, confs = head.draft_block(7, feats[8], 9, 10)
    logits = head.block_logits(7, 9)
    assert tokens == logits.argmax(-1).tolist() and len(tokens) == 4  # block 5: four drafts
    assert all(0.0 < c <= 1.0 for c in confs)
    assert head.draft_block(7, feats[8], 9, 2)[0] == tokens[:2]
    step_logits, step_hidden = head.draft_step(7, feats[8], 9)
    assert torch.allclose(step_logits, logits[0]) and step_hidden.shape == (16,)
    with pytest.raises(ValueError, match="feature rows are 16 wide"):
        head.draft_catch_up([1], torch.zeros(1, 16, dtype=torch.float64), 12)
    head.reset()
    assert all(store.max_position() == -1 for store in head._stores)
