"""tsspec_gguf.attention: the compiled causal attention against torch's softmax attention."""

from __future__ import annotations


import pytest
import torch

from tsspec_gguf import attention, native

pytestmark = [
    pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels were not built"),
    pytest.mark.usefixtures("scheme"),
]


@pytest.fixture(params=["key segments", "query heads"])
def scheme(request):
    """Every test runs on both chunkings: key segments (the default) and the previous one, query
    heads over all keys (``set_key_segments(False)``, kept for A/B runs)."""
    kernels = native.kernels()
    kernels.set_key_segments(request.param == "key segments")
    try:
        yield request.param
    finally:
        kernels.set_key_segments(True)


@pytest.fixture
def threads():
    """A context manager that runs torch (and so the kernels' attention calls) on n threads."""
    import contextlib

    @contextlib.contextmanager
    def on(n):
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    return on


def reference(q, k, v, past, heads):
    """Plain float64 attention: row t sees keys 0..past+t; head h reads KV head h // group."""
    rows, kv_heads, hd = q.shape[0], k.shape[0], k.shape[2]
    group = heads // kv_heads
    out = torch.empty(rows, heads, hd, dtype=torch.float64)
    for t in range(rows):
        for h in range(heads):
            keys = past + t + 1
            scores = k[h // group, :keys].double() @ q[t, h * hd : (h + 1) * hd].double()
            out[t, h] = torch.softmax(scores, 0) @ v[h // group, :keys].double()
    return out.reshape(rows, heads * hd)


def case(rows=5, past=37, heads=6, kv_heads=2, hd=16, capacity=64, extra=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads * hd + extra, generator=g)
    k = torch.randn(kv_heads, capacity, hd, generator=g)
    v = torch.randn(kv_heads, capacity, hd, generator=g)
    return q, k, v


@pytest.mark.parametrize("hd", [8, 16, 64, 12])
@pytest.mark.parametrize("rows,past", [(1, 0), (1, 40), (4, 3), (9, 21)])
def test_matches_softmax_attention(hd, rows, past):
    q, k, v = case(rows=rows, past=past, hd=hd, extra=2 * 2 * hd)  # K and V columns after Q
    got = attention.causal_attention(q, k, v, past, heads=6)
    assert got.shape == (rows, 6 * hd) and got.dtype == torch.float32
    assert torch.allclose(got.double(), reference(q, k, v, past, 6), rtol=1e-5, atol=1e-6)


def test_rows_are_batch_invariant():
    """Row t of a k-row call equals the 1-row call at the same position, bit for bit."""
    q, k, v = case(rows=8, past=30, hd=64, heads=9, kv_heads=3, capacity=40)
    full = attention.causal_attention(q, k, v, 30, heads=9)
    for t in range(8):
        one = attention.causal_attention(q[t : t + 1], k, v, 30 + t, heads=9)
        assert torch.equal(one[0], full[t])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(attention.causal_attention(q, k, v, 30, heads=9), full)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (8, 2), (8, 1), (3, 1)])
def test_query_heads_split_over_threads_give_the_same_rows(heads, kv_heads, rows, scalar_path):
    """Chunks are KV heads; several rows go in single query heads where the KV heads do not
    split evenly over the threads (3 over 2), one row in parts of a KV head's query heads where
    there are fewer KV heads than threads (1 over 2: 4 + 4 and 2 + 1). Every row is still the
    one-thread call's, bit for bit, and the reference's."""
    past = 1400  # enough keys that even 3 heads of one row run on two threads
    q, k, v = case(rows=rows, past=past, heads=heads, kv_heads=kv_heads, hd=64, capacity=past + 8)
    q *= 0.125  # the 1/sqrt(hd) scale a model folds into Q
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = attention.causal_attention(q, k, v, past, heads=heads)
        torch.set_num_threads(2)
        native.kernels().set_pool_stats(True)
        two = attention.causal_attention(q, k, v, past, heads=heads)
        chunks = native.kernels().pool_stats()["other"]["chunks"]
        native.kernels().set_pool_stats(False)
        with scalar_path():
            slow = attention.causal_attention(q, k, v, past, heads=heads)
    finally:
        torch.set_num_threads(threads)
        native.kernels().set_pool_stats(False)
    assert chunks >= 2  # the two-thread call was split
    assert torch.equal(one, two) and torch.equal(one, slow)
    assert torch.allclose(two.double(), reference(q, k, v, past, heads), rtol=1e-5, atol=1e-6)


def test_scalar_path_agrees_bit_for_bit(scalar_path):
    q, k, v = case(rows=3, past=50, hd=32, capacity=60)
    fast = attention.causal_attention(q, k, v, 50, heads=6)
    with scalar_path():
        slow = attention.causal_attention(q, k, v, 50, heads=6)
    assert torch.equal(fast, slow)


# scores of ~1e3 carry float32 rounding of ~1e-4 that the softmax passes on (either chunking:
# the dot products are the same); the more keys near the top, the more of it shows
@pytest.mark.parametrize("past,atol", [(10, 1e-5), (259, 1e-4)])
def test_large_score_gaps_do_not_overflow(past, atol):
    q, k, v = case(rows=2, past=past, hd=16, capacity=past + 2)
    q = q * 200.0  # scores far apart: most weights (and whole key segments) underflow to exactly 0
    got = attention.causal_attention(q, k, v, past, heads=6)
    assert torch.isfinite(got).all()
    assert torch.allclose(got.double(), reference(q, k, v, past, 6), rtol=1e-4, atol=atol)


def test_bad_operands_are_refused():
    q, k, v = case(rows=2, past=10, hd=16, capacity=11)
    with pytest.raises(ValueError):
        attention.causal_attention(q, k, v, 10, heads=6)  # past + rows > capacity
    with pytest.raises(ValueError, match="float32"):
        attention.causal_attention(q.double(), k, v, 0, heads=6)
    with pytest.raises(ValueError, match="contiguous"):
        attention.causal_attention(q, k.transpose(1, 2), v, 0, heads=6)
    with pytest.raises(ValueError):
        attention.causal_attention(q, k, v, 0, heads=5)  # not a multiple of the KV heads


def test_long_calls_go_in_slices_with_the_same_rows(monkeypatch):
    q, k, v = case(rows=11, past=5, hd=16, capacity=16)
    whole = attention.causal_attention(q, k, v, 5, heads=6)
    monkeypatch.setattr(attention, "ROW_SLICE", 4)
    assert torch.equal(attention.causal_attention(q, k, v, 5, heads=6), whole)


@pytest.mark.parametrize("hd,rows,past", [(64, 9, 500), (64, 2, 0), (32, 5, 63), (16, 4, 70), (128, 3, 45)])
def test_the_wide_loops_and_tree_sums_equal_the_scalar_path(hd, rows, past, scalar_path):
    """One query's scores eight keys and its V sums 64 elements at a time (narrower loops for
    the rest), and the scores' horizontal sums 4 or 8 at once (set_tree_sums): with tree sums
    on and off, on one thread and two, every row is the same, and the scalar path's, bit for
    bit."""
    kernels = native.kernels()
    q, k, v = case(rows=rows, past=past, heads=9, kv_heads=3, hd=hd, capacity=past + rows + 3, seed=hd)
    q *= hd**-0.5
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            for tree in (True, False):
                kernels.set_tree_sums(tree)
                try:
                    results.append(attention.causal_attention(q, k, v, past, heads=9))
                finally:
                    kernels.set_tree_sums(True)
        with scalar_path():
            results.append(attention.causal_attention(q, k, v, past, heads=9))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(r, results[0]) for r in results[1:])
    assert torch.allclose(results[0].double(), reference(q, k, v, past, 9), rtol=1e-5, atol=1e-6)


# -- key segments: boundaries, row counts, threads, GQA -------------------------------------------


@pytest.mark.parametrize("heads,kv_heads,hd", [(4, 4, 64), (9, 3, 64), (6, 2, 16), (8, 1, 32)])
def test_every_row_count_thread_count_and_path_gives_each_row_alone(heads, kv_heads, hd, scalar_path, threads):
    """Calls of 1-11 rows whose key counts run from 1 (a context of one key) and across the
    first and second key-segment boundaries (S - 5 .. S + 5, 2 S - 2 .. 2 S + 8) and a longer
    context: every row is bit for bit the row computed alone on one thread, whatever the row
    count, on 1, 2 and 3 threads and on the scalar path; and within 1e-5 of float64 attention."""
    seg = native.kernels().KEY_SEGMENT
    for past in (0, seg - 6, 2 * seg - 3, 5 * seg - 4):
        q, k, v = case(rows=11, past=past, heads=heads, kv_heads=kv_heads, hd=hd, capacity=past + 11, seed=past)
        q *= hd**-0.5  # the 1/sqrt(hd) scale a model folds into Q
        with threads(1):
            alone = torch.cat([attention.causal_attention(q[t : t + 1], k, v, past + t, heads) for t in range(11)])
        for n in (1, 2, 3):
            with threads(n):
                for rows in range(1, 12):
                    got = attention.causal_attention(q[:rows], k, v, past, heads)
                    assert torch.equal(got, alone[:rows]), (past, n, rows)
        with scalar_path():
            assert torch.equal(attention.causal_attention(q, k, v, past, heads), alone), past
        assert torch.allclose(alone.double(), reference(q, k, v, past, heads), rtol=1e-5, atol=1e-6), past


@pytest.mark.parametrize("past", [0, 100, 500])
def test_a_decode_row_with_enough_keys_runs_on_both_threads(past, threads, scheme):
    """A decode row's 9 queries over 3 KV heads: with key segments the row's chunks (segment, KV
    head) balance over two threads whatever the KV head count (query heads: 3 chunks, 2 + 1);
    its value is the one-thread one either way."""
    q, k, v = case(rows=1, past=past, heads=9, kv_heads=3, hd=64, capacity=past + 1)
    with threads(1):
        one = attention.causal_attention(q, k, v, past, heads=9)
    kernels = native.kernels()
    with threads(2):
        kernels.set_pool_stats(True)
        try:
            two = attention.causal_attention(q, k, v, past, heads=9)
            chunks = kernels.pool_stats()["other"]["chunks"]
        finally:
            kernels.set_pool_stats(False)
    assert torch.equal(one, two)
    if past >= 500:  # enough work to split
        assert chunks >= (4 if scheme == "key segments" else 3)


def test_the_two_chunkings_agree_bit_for_bit_within_one_segment_and_to_rounding_beyond():
    """A query with at most S keys has one segment, whose output o_0 / l_0 is the previous
    scheme's arithmetic exactly; beyond, the merge of segments moves it by rounding only."""
    kernels = native.kernels()
    seg = kernels.KEY_SEGMENT
    for past, rows in ((0, 11), (seg - 11, 11), (3 * seg, 9)):
        q, k, v = case(rows=rows, past=past, heads=9, kv_heads=3, hd=64, capacity=past + rows, seed=rows)
        q *= 0.125
        by_segments = attention.causal_attention(q, k, v, past, heads=9)
        kernels.set_key_segments(False)
        try:
            by_heads = attention.causal_attention(q, k, v, past, heads=9)
        finally:
            kernels.set_key_segments(True)
        if past + rows <= seg:
            assert torch.equal(by_segments, by_heads)
        else:
            assert torch.allclose(by_segments, by_heads, rtol=1e-5, atol=1e-6)


def test_a_prefill_slice_gives_each_row_alone(threads, scalar_path):
    """More than 16 rows (a prefill slice) go in span chunks (each folds every segment as it goes)
    in query shares on several threads; each row is still the row computed alone (a segment
    chunk's), across segment boundaries and within the first segment, on the scalar path too."""
    seg = native.kernels().KEY_SEGMENT
    for past in (0, seg - 20, 3 * seg - 30):
        q, k, v = case(rows=40, past=past, heads=9, kv_heads=3, hd=64, capacity=past + 40, seed=past)
        q *= 0.125
        with threads(1):
            alone = torch.cat([attention.causal_attention(q[t : t + 1], k, v, past + t, 9) for t in range(40)])
        for n in (2, 3):
            with threads(n):
                assert torch.equal(attention.causal_attention(q, k, v, past, 9), alone), (past, n)
        with scalar_path():
            assert torch.equal(attention.causal_attention(q, k, v, past, 9), alone), past
