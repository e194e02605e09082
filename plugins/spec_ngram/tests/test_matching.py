"""The pure match logic on tiny integer arrays, checked against brute-force scans."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tsspec_ngram.matching import (
    NGramDrafter,
    NGramIndex,
    continuation,
    match_length,
    required_match_length,
)


def brute_maps(index: NGramIndex) -> list[dict[int, int]]:
    """What the index maps must hold: for each order, key -> newest continuation position."""
    toks = index.tokens
    out = []
    for order in range(index.min_order, index.max_order + 1):
        table: dict[int, int] = {}
        for c in range(order, len(toks)):  # n-gram toks[c-order:c], continuation c < len
            table[index.key(toks[c - order : c])] = c
        out.append(table)
    return out


def brute_lookup(toks: list[int], min_order: int, max_order: int, low: int) -> tuple[int, int] | None:
    """Longest order first, most recent earlier occurrence of the suffix; never the suffix itself."""
    end = len(toks)
    for order in range(max_order, max(min_order, low) - 1, -1):
        if order > end - 1:
            continue
        suffix = toks[end - order :]
        for c in range(end - 1, order - 1, -1):
            if toks[c - order : c] == suffix:
                return c, order
    return None


def index_of(tokens, min_order=2, max_order=8, **kw) -> NGramIndex:
    index = NGramIndex(min_order, max_order, **kw)
    index.extend(tokens)
    return index


# -- the worked example of the module docstring -----------------------------------------------
def test_docstring_example():
    drafter = NGramDrafter(2, 3)
    drafter.sync([5, 1, 2, 3, 9, 1, 2])
    assert drafter.find() == (3, 2)
    assert drafter.draft(6) == [3, 9, 1, 2]


def test_longest_order_wins_over_more_recent_shorter_match():
    # (7, 1, 2) at 0..2 -> continuation 3 (= 4); (1, 2) also at 5..6 -> continuation 7 (= 6)
    toks = [7, 1, 2, 4, 0, 1, 2, 6, 7, 1, 2]
    index = index_of(toks)
    assert index.lookup() == (3, 3)
    assert brute_lookup(toks, 2, 8, 2) == (3, 3)


def test_most_recent_occurrence_wins_within_an_order():
    toks = [1, 2, 3, 1, 2, 4, 9, 1, 2]
    assert index_of(toks, 2, 2).lookup() == (5, 2)


def test_suffix_never_matches_itself():
    assert index_of([3, 4]).lookup() is None
    assert index_of([1, 2, 3, 4, 5]).lookup() is None
    assert NGramDrafter().draft(4) == []


def test_overlapping_occurrence_runs_into_the_suffix():
    # (1, 2, 1) at 0..2 overlaps the suffix at 2..4: what followed it IS the suffix's tail
    toks = [1, 2, 1, 2, 1]
    index = index_of(toks)
    assert index.lookup() == (3, 3)
    plain = NGramDrafter()
    plain.sync(toks)
    assert plain.draft(5) == [2, 1]  # cut at the end of the history


def test_self_referential_run_of_one_token():
    toks = [8, 8, 8]  # (8, 8) ends at 1 -> continuation 2, a period of one
    plain = NGramDrafter()
    plain.sync(toks)
    assert plain.find() == (2, 2)
    assert plain.draft(4) == [8]


def test_orders_at_the_boundaries():
    # max_order exactly fills an earlier occurrence starting at position 0
    toks = [1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert index_of(toks).lookup() == (8, 8)
    # an order-9 repeat is reported as order 8 (the longest indexed)
    toks9 = [9, *toks[:8], 0, 9, *toks[:8]]
    assert index_of(toks9).lookup() == (9, 8)
    # min_order: a single repeated token is not enough with orders 2..8
    assert index_of([5, 1, 6, 1]).lookup() is None
    assert index_of([5, 1, 6, 1], 1, 8).lookup() == (2, 1)
    # the required length excludes shorter orders
    toks = [1, 2, 3, 0, 2, 3]
    assert index_of(toks).lookup(2) == (3, 2)
    assert index_of(toks).lookup(3) is None


def test_continuation_is_cut_at_the_end():
    toks = [1, 2, 3, 4]
    assert continuation(toks, 1, 2) == [2, 3]
    assert continuation(toks, 2, 5) == [3, 4]


def test_match_length():
    toks = [1, 2, 3, 9, 1, 2, 3]
    assert match_length(toks, 3, 7, 32) == 3
    assert match_length(toks, 3, 7, 2) == 2
    assert match_length(toks, 4, 7, 32) == 0


def test_collisions_through_a_tiny_hash_are_never_trusted():
    # modulus 1: every n-gram of an order shares one key, so each map holds one entry
    toks = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    index = index_of(toks, 2, 3, modulus=1)
    assert len(index.maps[0]) == 1 and len(index.maps[1]) == 1
    # the newest order-2 entry is (6, 7) -> 7, which does not match the suffix (1, 2): no hit
    assert index.lookup() is None


@settings(max_examples=60, deadline=None)
@given(
    toks=st.lists(st.integers(0, 3), min_size=0, max_size=40),
    modulus=st.sampled_from([1, 2, 7, None]),
)
def test_every_hit_is_a_real_earlier_occurrence(toks, modulus):
    index = index_of(toks, 2, 5, modulus=modulus)
    found = index.lookup()
    end = len(toks)
    if found is not None:
        pos, length = found
        assert 2 <= length and pos < end
        assert toks[pos - length : pos] == toks[end - length :]
    if modulus is None:
        assert (None if found is None else tuple(found)) == brute_lookup(toks, 2, 5, 2)


def test_required_match_length_mapping():
    assert required_match_length(0.0) == 2
    assert required_match_length(0.1) == 2  # ceil(0.8) = 1, clamped up to the shortest order
    assert required_match_length(0.25) == 2
    assert required_match_length(0.3) == 3
    assert required_match_length(0.5) == 4
    assert required_match_length(0.75) == 6
    assert required_match_length(1.0) == 8
    assert required_match_length(0.0, 3, 6) == 3
    assert required_match_length(1.0, 2, 5) == 5


# -- rewinds: the index after any commit/rewind sequence equals one built from scratch --------
ops = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.lists(st.integers(0, 4), max_size=12)),
        st.tuples(st.just("truncate"), st.integers(0, 40)),
        st.tuples(st.just("write"), st.tuples(st.lists(st.integers(0, 4), max_size=6), st.integers(0, 40))),
    ),
    max_size=14,
)


def _apply_ops(index, ops):
    """Apply ``ops`` to ``index`` and to a plain list; yields the list after each op (a write
    the index refuses must start past the end)."""
    model: list[int] = []
    for op, arg in ops:
        if op == "extend":
            index.extend(arg)
            model.extend(arg)
        elif op == "truncate":
            index.truncate(arg)
            del model[arg:]
        else:
            tokens, start = arg
            if index.write(tokens, start):
                model[start:] = tokens
            else:
                assert start > len(model)
        yield model


@settings(max_examples=80, deadline=None)
@given(ops=ops, modulus=st.sampled_from([3, None]))
def test_index_consistent_after_random_commit_and_rewind(ops, modulus):
    index = NGramIndex(2, 5, modulus=modulus)
    for model in _apply_ops(index, ops):
        assert index.tokens == model
        assert index.maps == brute_maps(index)
        fresh = index_of(model, 2, 5, modulus=modulus)
        assert index.lookup() == fresh.lookup()
        if modulus is None:
            found = index.lookup()
            assert (None if found is None else tuple(found)) == brute_lookup(model, 2, 5, 2)


def test_write_keeps_equal_tokens_and_truncates_stale_tail():
    index = index_of([1, 2, 3, 4, 5])
    assert index.write([3, 9], 2)
    assert index.tokens == [1, 2, 3, 9]
    assert index.write([1, 2], 0)
    assert index.tokens == [1, 2]
    assert not index.write([7], 5)  # a gap: nothing changes
    assert index.tokens == [1, 2]
    assert index.maps == brute_maps(index)


def test_sync_appends_and_rewinds_along_the_history():
    drafter = NGramDrafter(2, 4)
    drafter.sync([1, 2, 3])
    drafter.sync([1, 2, 3, 4, 5])  # the protocol's case: new tokens at the end
    assert drafter.index.tokens == [1, 2, 3, 4, 5]
    drafter.sync([1, 2, 3, 7])  # a rewind then another token: seen at the last-token check
    assert drafter.index.tokens == [1, 2, 3, 7]
    drafter.sync([6, 2, 3, 7, 1])  # another sequence: seen at position 0
    assert drafter.index.tokens == [6, 2, 3, 7, 1]
    assert drafter.index.maps == brute_maps(drafter.index)


@settings(max_examples=60, deadline=None)
@given(
    first=st.lists(st.integers(0, 3), max_size=30),
    second=st.lists(st.integers(0, 3), max_size=30),
    count=st.integers(1, 6),
)
def test_propose_copies_a_genuine_occurrence_whatever_the_index_held(first, second, count):
    """A stale index (``first``) may cost a draft, never an invented one: every draft is what
    followed a real earlier occurrence of the suffix in ``second``, the authority."""
    drafter = NGramDrafter(2, 4, follow=True)
    drafter.propose(first, count)
    draft = drafter.propose(second, count)
    assert len(draft) <= count
    if draft:
        end = len(second)
        assert any(
            second[c - n : c] == second[end - n :]
            and draft == continuation(second, c, count)
            for n in range(2, 5)
            for c in range(n, end)
        )
    resynced = NGramDrafter(2, 4)
    resynced.propose(first, count)
    resynced.resync(second)
    assert resynced.index.tokens == second
    assert resynced.index.maps == brute_maps(resynced.index)


def test_propose_resyncs_when_a_draft_rests_on_a_stale_token():
    drafter = NGramDrafter(2, 2)
    drafter.propose([1, 2, 3, 0, 0, 1, 2], 2)
    # the middle changed behind the index's back (3 -> 9); the spot checks cannot see it
    history = [1, 2, 9, 0, 0, 1, 2]
    assert drafter.propose(history, 2) == [9, 0]
    assert drafter.index.tokens == history


def test_follow_keeps_the_source_that_agreed_last():
    # a 12-token source region, then a more recent copy of its last 8 tokens followed by 30,
    # then the source being copied again: following the source beats the jump to 30
    source = list(range(10, 22))
    toks = source + [22, 23, 0] + source[4:] + [30, 31, 5] + source[:-1]
    drafter = NGramDrafter(2, 8, follow=True)
    drafter.sync(toks)
    assert drafter.find() == (11, 8)
    assert drafter.draft(2) == [21, 22]
    drafter.sync(toks + [21])  # the first drafted token landed
    assert drafter.find() == (12, 12)  # followed, with its longer backward match
    assert drafter.draft(1) == [22]
    plain = NGramDrafter(2, 8)
    plain.sync(toks + [21])
    assert plain.find() == (23, 8) and plain.draft(1) == [30]
    drafter.sync(toks + [21, 7])  # a miss: the followed source no longer agrees
    assert drafter.find() is None


def test_draft_never_exceeds_count():
    drafter = NGramDrafter()
    drafter.sync([1, 2] * 20)
    for count in range(0, 12):
        assert len(drafter.draft(count)) == min(count, 2)


# -- the single-token fallback ------------------------------------------------------------------
# a source [10..17] then 7 16 17 elsewhere; the text copies the source, then rewords 13 as 7
FALLBACK_PROMPT = [10, 11, 12, 13, 14, 15, 7, 16, 17, 0]


def _drafter_after_a_copy(fallback: bool, prompt=FALLBACK_PROMPT) -> NGramDrafter:
    """The copy 10 11 -> draft [12, 13, ..]; then 12 landed and 7 came instead of 13."""
    drafter = NGramDrafter(2, 8, follow=True, fallback=fallback)
    drafter.sync(prompt + [10, 11])
    assert drafter.draft(4) == [12, 13, 14, 15]
    drafter.sync(prompt + [10, 11, 12, 7])
    return drafter


def test_fallback_drafts_from_the_last_token_where_no_bigram_occurred():
    assert _drafter_after_a_copy(False).draft(3) == []  # (12, 7) never occurred: the old rule stops
    drafter = _drafter_after_a_copy(True)
    assert drafter.draft(3) == [16, 17, 0]
    assert drafter._match == (7, 1)  # 7 alone, seen once, followed by 16


def test_fallback_needs_one_follower_and_a_copy_that_agreed_lately():
    # 7 occurred twice before, followed by 16 and by 3: which one comes is a guess
    mixed = FALLBACK_PROMPT[:-1] + [7, 3, 0]
    assert _drafter_after_a_copy(True, mixed).draft(3) == []
    # the same follower twice is no guess
    same = FALLBACK_PROMPT[:-1] + [7, 16, 0]
    assert _drafter_after_a_copy(True, same).draft(2) == [16, 0]
    # no draft agreed with the text lately (a fresh drafter, or one far past its last copy)
    fresh = NGramDrafter(2, 8, follow=True, fallback=True)
    fresh.sync(FALLBACK_PROMPT + [10, 11, 12, 7])
    assert fresh.draft(3) == []
    late = _drafter_after_a_copy(True)
    late.sync(FALLBACK_PROMPT + [10, 11, 12, 40, 41, 42, 43, 7])
    assert late.draft(3) == []
    # a required match longer than the shortest order (--spec-pmin) never falls back
    assert _drafter_after_a_copy(True).draft(3, min_length=3) == []


def brute_mixed(toks: list[int]) -> dict[int, int]:
    """Per token: how many of its occurrences were followed otherwise than the one before."""
    mixed: dict[int, int] = {}
    last_follower: dict[int, int] = {}
    for c in range(1, len(toks)):
        context = toks[c - 1]
        if context in last_follower and last_follower[context] != toks[c]:
            mixed[context] = mixed.get(context, 0) + 1
        last_follower[context] = toks[c]
    return mixed


@settings(max_examples=80, deadline=None)
@given(ops=ops)
def test_followers_of_single_tokens_stay_exact_after_commit_and_rewind(ops):
    index = NGramIndex(1, 4)
    for model in _apply_ops(index, ops):
        assert index.tokens == model
        assert index.maps == brute_maps(index)
        assert index.mixed == brute_mixed(model)
        assert all(index.agreed(t) == (t not in brute_mixed(model)) for t in set(model))


def test_a_colliding_single_token_key_counts_as_mixed():
    index = NGramIndex(1, 3, modulus=1)  # every key collides
    index.extend([4, 5, 6, 7])
    assert not index.agreed(5)  # 6 follows 5, but the map's previous entry was 4's: never trusted
