"""PositionalTarget: length, last-forward span, keep and rewind of a by-position target."""

from __future__ import annotations

import pytest

from tsspec_gguf.positional_target import PositionalTarget


class _Cache:
    def __init__(self):
        self.size = 0

    def ensure(self, n):
        self.size = max(self.size, n)

    def nbytes(self):
        return 4 * self.size


class _Target(PositionalTarget):
    def __init__(self):
        self._start_positions(_Cache(), max_context=16, vocab_size=10)

    def spec_forward(self, tokens, *, all_logits_rows=True, want_hidden=False):
        tokens = self._rows_in(tokens)
        self._forwarded(len(tokens))
        return tokens, None


class _Head:
    resets = 0

    def reset(self):
        self.resets += 1


def test_keep_sets_the_length_inside_the_last_forward_and_counts_drops():
    t = _Target()
    t.spec_forward([1, 2, 3])
    t.spec_keep(3)
    t.spec_forward([4, 5, 6])
    t.spec_keep(1)
    assert t.cache_seq_len == 4 and t.counters.keeps == 1 and t.counters.forward_rows == 6
    assert t.cache_bytes == 4 * 6 and t.max_context_length == 16
    with pytest.raises(ValueError, match="cannot keep 2 rows of a forward of 1"):
        t.spec_keep(2)


def test_rewind_and_checks():
    t = _Target()
    t.draft_head = _Head()
    t.spec_forward([1, 2, 3, 4])
    t.spec_rewind_cache(2)
    with pytest.raises(ValueError, match="cannot keep 1 rows of a forward of 0"):  # a rewind ends the span
        t.spec_keep(1)
    with pytest.raises(ValueError, match="cannot rewind to 3"):
        t.spec_rewind_cache(3)
    t.spec_rewind_cache(0)
    assert t.draft_head.resets == 1
    with pytest.raises(ValueError, match="outside the vocabulary"):
        t.spec_forward([10])
    with pytest.raises(ValueError, match="at least one token"):
        t.spec_forward([])
    with pytest.raises(ValueError, match="17 positions exceed the context of 16"):
        t.spec_forward([1] * 17)
