"""The block-hash prefix cache: keys, sharing, reference counts, LRU eviction, copy-on-write."""

from __future__ import annotations

import pytest

from tsspec_serve.prefix_cache import ROOT, BlockPool, BlockTable, OutOfBlocks, chain_key


def _table(pool, copies=None):
    return BlockTable(pool, lambda src, dst: copies.append((src, dst)) if copies is not None else None)


def _run(pool, tokens, reserve=None):
    """A sequence that adopts what it can, computes the rest and keeps every token."""
    table = _table(pool)
    start = table.adopt(tokens)
    need = reserve if reserve is not None else -(-len(tokens) // pool.block_size)
    assert pool.reserve(need)
    table.reserved = need
    table.prepare_write(start, len(tokens))
    table.commit(tokens[start:], start)
    return table, start


def test_keys_chain_over_the_whole_prefix_and_the_identity():
    pool = BlockPool(8, 4, identity="model-a")
    a = pool.keys([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(a) == 2  # full blocks only
    assert a[0] == chain_key(ROOT, b"model-a", [1, 2, 3, 4])
    # the same second block after a different first block has a different key
    assert pool.keys([0, 2, 3, 4, 5, 6, 7, 8])[1] != a[1]
    assert BlockPool(8, 4, identity="model-b").keys([1, 2, 3, 4]) != a[:1]
    assert pool.keys([5, 6, 7, 8], a[0], 1) == []  # start_block past the end
    assert pool.keys([1, 2, 3, 4, 5, 6, 7, 8], a[0], 1) == a[1:]


def test_a_second_sequence_adopts_full_blocks_and_both_hold_them():
    pool = BlockPool(8, 4)
    prompt = list(range(10))
    first, reused = _run(pool, prompt)
    assert reused == 0 and len(first.blocks) == 3 and len(first.keys) == 2
    second = _table(pool)
    # the last prompt token is always left to compute, so a 9-token match stops at 8
    assert second.adopt(prompt[:9] + [99]) == 8
    assert second.blocks == first.blocks[:2] and pool.refs(first.blocks[0]) == 2
    assert pool.hit_tokens == 8 and pool.queried_tokens == 20 and pool.hit_rate == pytest.approx(0.4)
    third = _table(pool)
    assert third.adopt(prompt[:8]) == 4  # 8 tokens: only the first block (the last token computes)
    third.free()
    second.free()
    first.free()
    assert pool.in_use == 0 and pool.cached == 2 and pool.available == 8


def test_lru_eviction_keeps_the_most_recently_released_prefixes():
    pool = BlockPool(3, 2)
    a, _ = _run(pool, [1, 2, 3])  # 2 blocks, one full
    a.free()
    b, _ = _run(pool, [7, 8, 9])
    b.free()
    assert pool.cached == 2
    c, _ = _run(pool, [4, 5, 6, 7, 8])  # needs 3 blocks: one free + evicts [1, 2]'s block
    assert pool.evictions >= 1
    c.free()
    probe = _table(pool)
    assert probe.adopt([1, 2, 0]) == 0  # evicted
    assert probe.adopt([4, 5, 6, 7, 0]) == 4
    probe.free()


def test_reservations_bound_admission_and_are_given_back():
    pool = BlockPool(4, 2)
    assert pool.reserve(3) and not pool.reserve(2) and pool.available == 1
    table = _table(pool)
    table.reserved = 3
    table.prepare_write(0, 3)  # two blocks out of the reservation
    assert table.reserved == 1 and pool.reserved == 1 and pool.available == 1
    table.free()
    assert pool.reserved == 0 and pool.available == 4
    with pytest.raises(ValueError):
        pool.unreserve(1)


def test_writing_into_a_shared_block_copies_it_first():
    pool = BlockPool(8, 4)
    first, _ = _run(pool, list(range(9)))
    copies: list = []
    second = _table(pool, copies)
    assert second.adopt(list(range(9))) == 8
    assert pool.reserve(2)
    second.reserved = 2
    second.truncate(6)  # a rewind into the second shared block
    second.prepare_write(6, 9)
    assert copies == [(first.blocks[1], second.blocks[1])] and second.blocks[0] == first.blocks[0]
    assert pool.refs(first.blocks[1]) == 1 and len(second.keys) == 1
    second.commit([60, 70, 80], 6)
    assert second.tokens == [0, 1, 2, 3, 4, 5, 60, 70, 80] and len(second.keys) == 2
    second.free()
    first.free()


def test_errors():
    with pytest.raises(ValueError):
        BlockPool(0, 4)
    pool = BlockPool(1, 2)
    block = pool.allocate(reserved=False)
    with pytest.raises(OutOfBlocks):
        pool.allocate(reserved=False)
    pool.release(block)
    with pytest.raises(ValueError):
        pool.release(block)
    table = _table(pool)
    with pytest.raises(ValueError, match="gap"):
        table.commit([1], 3)
    with pytest.raises(ValueError):
        table.truncate(2)


def test_a_sequence_takes_the_free_block_after_its_last_one():
    pool = BlockPool(8, 2)
    a, _ = _run(pool, [1, 2, 3, 4, 5])  # blocks 0, 1, 2 (the last one partial)
    assert a.blocks == [0, 1, 2]
    a.free()  # 0 and 1 are cached (full, keyed), 2 goes back to the free list
    b = _table(pool)
    assert b.adopt([1, 2, 3, 4, 9, 9, 9]) == 4
    assert pool.reserve(2)
    b.reserved = 2
    b.prepare_write(4, 7)
    assert b.blocks == [0, 1, 2, 3]  # the free block after each, not the free list's last
    b.free()
    # a cached block after the last one is never taken out of turn: the prefix stays adoptable
    c = _table(pool)
    assert c.adopt([1, 2, 0]) == 2 and c.blocks == [0]
    assert pool.reserve(1)
    c.reserved = 1
    c.prepare_write(2, 4)
    assert c.blocks[1] != 1 and pool.evictions == 0
    c.free()


def test_relocate_copies_adopted_blocks_to_a_free_run():
    pool, copies = BlockPool(10, 2), []
    a, _ = _run(pool, [1, 2, 3, 4, 5, 6])  # blocks 0, 1, 2: all full, cached after free
    a.free()
    b = _table(pool, copies)
    assert b.adopt([1, 2, 3, 4, 5, 6, 7]) == 6 and b.blocks == [0, 1, 2]
    # the next block (3) is free: nothing to move
    assert not b.relocate(6)
    b.free()
    c, _ = _run(pool, [1, 2, 9, 9])  # adopts block 0, then takes 3 (block 1 is cached)
    assert c.blocks[0] == 0 and c.blocks[1] != 1
    c.free()
    d = _table(pool, copies)
    assert d.adopt([1, 2, 3, 4, 8]) == 4 and d.blocks == [0, 1]  # block 2 after them is cached
    assert d.relocate(4)
    start = d.blocks[0]
    assert d.blocks == [start, start + 1] and copies == [(0, start), (1, start + 1)]
    assert pool.refs(0) == 0 and pool.cached >= 3  # the originals stay cached
    assert pool.reserve(2)
    d.reserved = 2
    d.prepare_write(4, 6)
    assert d.blocks == [start, start + 1, start + 2]
    d.commit([8, 0], 4)
    d.free()
    assert pool.reserved == 0 and pool.in_use == 0
    probe = _table(pool)
    assert probe.adopt([1, 2, 3, 4, 5, 6, 0]) == 6  # the cached prefix survived
    probe.free()
    # no run long enough: nothing moves
    e = _table(pool)
    e.adopt([1, 2, 3, 4, 0])
    assert not e.relocate(20)
    e.free()
