"""The draft pool: counting followers, the longest confident context, eviction, persistence."""

from __future__ import annotations

import pytest

from tsspec_serve.memory import ORDERS, DraftPool, PoolStore, key_id

TEXT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]


def test_followers_come_from_the_longest_confident_context():
    pool = DraftPool()
    pool.merge(TEXT)
    assert pool.follower(TEXT[:9], 0.5)[:2] == (TEXT[9], 8)  # the whole 8-token context matched
    assert pool.follower([99, 99, 6, 7, 8], 0.5) is None  # only order 3 matches: it needs 2 votes
    assert pool.follower([99, 5, 6, 7, 8], 0.5) is None  # order 4: 2 votes too
    assert pool.follower([99, 5, 6, 7, 8, 9], 0.5) == (10, 5, 0.5)  # order 5 may draft after one
    pool.merge(TEXT)
    assert pool.follower([99, 99, 6, 7, 8], 0.5)[:2] == (9, 3)
    assert pool.follower([1, 2], 0.5) is None  # shorter than every order


def test_a_follower_needs_its_share_of_the_votes():
    pool = DraftPool()
    for nxt in (40, 41, 41, 41):
        pool.merge([1, 2, 3, 4, 5, 6, 7, 8, nxt])
    assert pool.follower([1, 2, 3, 4, 5, 6, 7, 8], 0.5) == (41, 8, 3 / 5)
    assert pool.follower([1, 2, 3, 4, 5, 6, 7, 8], 0.9) is None  # 3 votes of 4


def test_eviction_keeps_the_pool_bounded_and_frequent_entries_longest():
    pool = DraftPool(max_entries=200)
    rare = [list(range(s, s + 12)) for s in range(0, 60, 12)]
    common = list(range(1000, 1012))
    for text in rare:  # the oldest, seen once
        pool.merge(text)
    for _ in range(20):
        pool.merge(common)
    for start in range(2000, 2120, 12):  # newer than everything, seen once
        pool.merge(list(range(start, start + 12)))
        assert len(pool) <= 200
    assert pool.evicted > 0
    assert pool.follower(common[:9], 0.5)[:2] == (common[9], 8)  # older than the newest, but frequent
    assert all(pool.follower(text[:9], 0.5) is None for text in rare)  # old and rare: gone
    with pytest.raises(ValueError):
        DraftPool(max_entries=3)


def test_pools_persist_per_key(tmp_path):
    path = tmp_path / "pool.bin"
    store = PoolStore("model.gguf:300", path)
    store.pool(key_id("sk-secret-a")).merge(TEXT)
    store.pool("").merge(TEXT[::-1])
    store.save()
    again = PoolStore("model.gguf:300", path)
    assert again.load() == sum(len(p) for p in store.pools.values()) and again.warning is None
    assert again.pool(key_id("sk-secret-a")).follower(TEXT[:9], 0.5)[:2] == (TEXT[9], 8)
    assert again.pool(key_id("sk-secret-b")).follower(TEXT[:9], 0.5) is None
    assert key_id("sk-secret-a") != key_id("sk-secret-b") and b"sk-secret" not in path.read_bytes()
    assert again.pool(key_id("sk-secret-a")).tick == 1 and key_id(None) == ""


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other-model", "trailing"])
def test_a_damaged_file_is_ignored_with_a_warning(tmp_path, damage, caplog):
    path = tmp_path / "pool.bin"
    store = PoolStore("model.gguf:300", path)
    store.pool("").merge(TEXT * 3)
    store.save()
    data = path.read_bytes()
    identity = "model.gguf:300"
    if damage == "garbage":
        path.write_bytes(b"\x00\x01not a pool at all")
    elif damage == "truncated":
        path.write_bytes(data[:-7])
    elif damage == "trailing":
        path.write_bytes(data + b"x")
    else:
        identity = "other.gguf:300"
    again = PoolStore(identity, path)
    assert again.load() == 0 and again.pools == {}
    assert again.warning and str(path) in again.warning and "\n" not in again.warning
    assert again.warning in caplog.text


def test_save_without_a_path_does_nothing_and_orders_are_longest_first():
    PoolStore("m", None).save()
    assert list(ORDERS) == sorted(ORDERS, reverse=True)
