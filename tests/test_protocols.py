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


# -- HeadCounts: a draft head's calls and rows, its views' added to its own ---------------------


def test_head_counts_add_a_views_calls_to_its_head():
    head = tsspec.HeadCounts()
    a, b = head.view(), head.view()
    nested = a.view()  # a view of a view adds to the same head
    head.add(rows=1)
    a.add(rows=6)
    b.add(rows=2)
    nested.add()
    assert (a.calls, a.rows, b.calls, b.rows, nested.calls, nested.rows) == (1, 6, 1, 2, 1, 0)
    assert (head.calls, head.rows) == (4, 9)
    assert repr(head) == "HeadCounts(calls=4, rows=9)"


class _HeldLock:
    """A lock that says whether it is held."""

    def __init__(self):
        self.held = False

    def __enter__(self):
        assert not self.held
        self.held = True

    def __exit__(self, *exc):
        self.held = False


def test_head_counts_update_every_counter_under_the_lock(monkeypatch):
    """The head's own calls and its views' (in other threads) change the same totals: each
    update holds the lock, the head's own included."""
    from tsspec import protocols

    lock = _HeldLock()
    monkeypatch.setattr(protocols, "_COUNTS_LOCK", lock)
    seen = []

    class Watched(protocols.HeadCounts):
        __slots__ = ()

        def __setattr__(self, name, value):
            seen.append((name, lock.held))
            super().__setattr__(name, value)

    head = Watched()
    view = head.view()
    seen.clear()
    head.add(rows=3)
    view.add(rows=2)
    assert seen and all(held for _, held in seen)
    assert (head.calls, head.rows, view.calls, view.rows) == (2, 5, 1, 2)


def test_head_counts_are_exact_under_threads():
    import threading

    head = tsspec.HeadCounts()
    views = [head.view() for _ in range(3)]

    def run(counts):
        for _ in range(2000):
            counts.add(rows=2)

    threads = [threading.Thread(target=run, args=(c,)) for c in [head, *views]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (head.calls, head.rows) == (8000, 16000)
    assert all((v.calls, v.rows) == (2000, 4000) for v in views)
