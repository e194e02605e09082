"""The drafter's context store: ring overwrite, linear growth, rewinds, windows."""

from __future__ import annotations

import torch

from tsspec_block.kv_ring import EMPTY, ContextKV


def _rows(positions):
    pos = torch.tensor(positions, dtype=torch.long)
    k = pos.to(torch.float64)[:, None, None].expand(-1, 1, 2).clone()
    return pos, k, -k


def test_ring_overwrites_by_position_modulo_rows():
    ring = ContextKV(1, 2, 2, rows=4, dtype=torch.float64)
    ring.write(*_rows([0, 1, 2]))
    ring.write(*_rows([3, 4, 5]))  # 4 and 5 take the slots of 0 and 1
    keys, values, pos = ring.gather(0, 100)
    assert sorted(pos.tolist()) == [2, 3, 4, 5]
    assert torch.equal(keys[:, 0, 0], pos.to(torch.float64)) and torch.equal(values, -keys)
    assert sorted(ring.gather(3, 5)[2].tolist()) == [3, 4]  # slot order, not position order


def test_long_write_keeps_the_last_rows():
    ring = ContextKV(1, 2, 2, rows=4, dtype=torch.float64)
    ring.write(*_rows(list(range(10))))
    assert sorted(ring.gather(0, 100)[2].tolist()) == [6, 7, 8, 9]


def test_forget_from_drops_a_rewound_tail():
    ring = ContextKV(1, 2, 2, rows=8, dtype=torch.float64)
    ring.write(*_rows([0, 1, 2, 3, 4]))
    ring.forget_from(2)
    assert sorted(ring.gather(0, 100)[2].tolist()) == [0, 1]
    assert ring.max_position() == 1
    ring.clear()
    assert ring.max_position() == EMPTY


def test_linear_store_grows_and_keeps_gaps_empty():
    store = ContextKV(1, 2, 2, rows=None, dtype=torch.float64)
    store.write(*_rows([0, 1]))
    store.write(*_rows([600, 601]))  # a gap: positions 2..599 were never given
    assert store.capacity >= 602
    assert store.gather(0, 1000)[2].tolist() == [0, 1, 600, 601]
