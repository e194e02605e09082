"""tsspec_gguf.qlinear: block matrices and the compiled block kernel.

The reference nobody here wrote is gguf's numpy quantiser/dequantiser: blocks quantised by it
must unpack to exactly its dequantised values, and products must match a float64 matmul.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from tsspec_gguf import native, qlinear
from tsspec_gguf.qlinear import BlockMatrix, pack_tensor

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
needs_native = pytest.mark.skipif(not native.available(), reason="the block kernel was not built")


def make(kind, n=40, k=96, seed=0):
    """(BlockMatrix, gguf's dequantised float32 [n, k]) of a random matrix quantised by gguf."""
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    raw = quants.quantize(w, kind)  # [n, bytes]
    return pack_tensor(raw.reshape(-1), kind, (n, k)), torch.from_numpy(quants.dequantize(raw, kind).reshape(n, k))


@pytest.mark.parametrize("kind", TYPES)
def test_blocks_unpack_to_gguf_dequantised_values(kind):
    bm, ref = make(kind)
    assert bm.fmt == (4 if kind in (T.Q4_0, T.Q4_1) else 8)  # Q5_0 / Q5_1: int8 blocks, exactly
    assert torch.equal(bm.dequantize(), ref)
    assert torch.equal(qlinear._dequantize_torch(bm.fmt, bm.q, bm.d, bm.m), ref)
    ids = torch.tensor([3, 0, 39, 3])
    assert torch.equal(bm.rows(ids), ref[ids])  # a verify's lookup: the kernel, row by row
    many = torch.arange(qlinear.GEMM_ROWS + 8) % 40  # a prefill's: one batch of torch ops
    assert torch.equal(bm.rows(many), ref[many])
    over = qlinear.GEMM_ROWS + 1  # a prefill's lookup refuses them too (never wraps a negative id)
    for bad in ([40], [0, -1], [0] * over + [40], [0] * over + [-1]):
        with pytest.raises(IndexError):
            bm.rows(torch.tensor(bad))
    assert torch.equal(bm.dequantize(slice(5, 9)), ref[5:9])


@needs_native
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13])
def test_linear_matches_float64_reference(kind, rows):
    bm, ref = make(kind, n=72, k=160, seed=rows)
    x = torch.randn(rows, 160, generator=torch.Generator().manual_seed(rows))
    expected = (x.double() @ ref.double().t())
    got = bm.linear(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 72)
    assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-4)
    base = torch.randn(rows, 72)
    assert torch.allclose(bm.linear(x, base).double(), expected + base.double(), rtol=1e-5, atol=1e-4)


@needs_native
@pytest.mark.parametrize("kind", TYPES)
def test_rows_are_batch_invariant(kind):
    """A row's result is bit-identical whatever rows share the call and the thread count."""
    bm, _ = make(kind, n=64, k=128)
    x = torch.randn(11, 128, generator=torch.Generator().manual_seed(1))
    full = bm.linear(x)
    for r in range(11):
        assert torch.equal(bm.linear(x[r : r + 1]), full[r : r + 1])
    for start, stop in ((0, 2), (2, 5), (3, 10)):
        assert torch.equal(bm.linear(x[start:stop]), full[start:stop])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(bm.linear(x), full)
    finally:
        torch.set_num_threads(threads)


@needs_native
@pytest.mark.parametrize("kind", TYPES)
def test_scalar_path_agrees_bit_for_bit(kind, scalar_path):
    bm, _ = make(kind, n=24, k=64)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    fast = bm.linear(x)
    with scalar_path():
        assert native.info()["simd"] == "scalar"
        slow = bm.linear(x)
        deq = bm.dequantize()
    assert torch.equal(fast, slow)
    assert torch.equal(deq, bm.dequantize())


@needs_native
@pytest.mark.parametrize("precision", qlinear.PRECISIONS)
def test_long_calls_stay_on_the_kernel_bit_for_bit(monkeypatch, precision):
    """A call longer than any verify (a solo prefill of 100-1,000 tokens) gives every row bit
    for bit what a one-row call or a served chunk gives, in every precision: no timing run sends
    it to a path with other sums (torch's GEMM) or other arithmetic (float32 under int8)."""
    calls = []
    monkeypatch.setattr(BlockMatrix, "_linear_torch", lambda self, x, base: calls.append(x) or 1 / 0)
    bm, _ = make(T.Q4_1, n=30, k=64)
    x = torch.randn(qlinear.GEMM_ROWS * 3 + 5, 64, generator=torch.Generator().manual_seed(4))
    base = torch.randn(x.shape[0], 30, generator=torch.Generator().manual_seed(5))
    full = bm.linear(x, base, precision=precision)
    assert not calls
    for r in (0, qlinear.GEMM_ROWS, x.shape[0] - 1):
        assert torch.equal(bm.linear(x[r : r + 1], base[r : r + 1], precision=precision), full[r : r + 1])
    chunks = [bm.linear(x[i : i + 16], base[i : i + 16], precision=precision) for i in range(0, x.shape[0], 16)]
    assert torch.equal(torch.cat(chunks), full)


def test_without_the_kernel_everything_still_works(monkeypatch):
    bm, ref = make(T.Q8_0, n=16, k=64)
    from tsspec_gguf import native

    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_checked", True)
    assert not native.available() and native.info()["simd"] is None
    x = torch.randn(3, 64)
    assert torch.equal(bm.dequantize(), ref)
    assert torch.allclose(bm.linear(x).double(), x.double() @ ref.double().t(), rtol=1e-5, atol=1e-4)


def test_concat_widens_mixed_formats_and_scaling_is_exact():
    q4, ref4 = make(T.Q4_1, n=8, k=64, seed=1)
    q8, ref8 = make(T.Q8_0, n=4, k=64, seed=2)
    both = BlockMatrix.concat([q4.scaled(0.125), q8])
    assert both.fmt == 8 and both.shape == (12, 64)
    assert torch.equal(both.dequantize(), torch.cat([ref4 * 0.125, ref8]))
    same = BlockMatrix.concat([q4, q4])
    assert same.fmt == 4 and torch.equal(same.dequantize(), torch.cat([ref4, ref4]))


def test_cache_tensors_round_trip():
    bm, ref = make(T.Q4_0)
    flat = bm.tensors("l0.wo")
    assert set(flat) == {"l0.wo.q4", "l0.wo.d", "l0.wo.m"}
    back = BlockMatrix.from_tensors(flat, "l0.wo")
    assert back is not None and torch.equal(back.dequantize(), ref)
    assert BlockMatrix.from_tensors(flat, "l1.wo") is None


def test_unpackable_types_and_shapes_are_declined():
    raw = np.zeros(64 * 4, dtype=np.uint8)
    assert pack_tensor(raw, T.F32, (4, 16)) is None
    assert pack_tensor(raw, T.Q2_K, (1, 256)) is None
    assert pack_tensor(raw, T.Q8_0, (4,)) is None


def test_bad_operands_are_refused():
    bm, _ = make(T.Q8_0, n=8, k=64)
    with pytest.raises(ValueError, match="columns"):
        bm.linear(torch.zeros(2, 32))
    with pytest.raises(ValueError, match="float32"):
        bm.linear(torch.zeros(2, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match="uint8"):
        BlockMatrix(4, torch.zeros(2, 3, dtype=torch.uint8), torch.zeros(2, 1), torch.zeros(2, 1))
    if native.available():
        with pytest.raises(ValueError):
            native.kernels().gemm(5, 1, 1, 1, 1, 32, 1, 1, 1, 0, 1)


@needs_native
def test_pool_serves_concurrent_callers_and_forked_children():
    """Two Python threads calling at once (one runs inline while the pool is busy) and a forked
    child (which has none of the parent's workers) all get the single-caller results."""
    import os
    import threading

    bm, _ = make(T.Q4_1, n=512, k=256)
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = bm.linear(x)
        results, errors = [], []

        def call():
            try:
                for _ in range(50):
                    results.append(torch.equal(bm.linear(x), expected))
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        workers = [threading.Thread(target=call) for _ in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors and len(results) == 150 and all(results)
        pid = os.fork()
        if pid == 0:  # child: exit code says whether the pool still works there
            os._exit(0 if torch.equal(bm.linear(x), expected) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        torch.set_num_threads(threads)


@needs_native
def test_a_threads_gemm_scratch_is_freed_when_the_thread_ends():
    """A caller's row buffer lives as long as its thread: the server's sequences each run in a
    thread of their own and their drafter calls the kernel there, so a buffer kept past the
    thread's end would grow memory with every request. Measured as address space (the buffer
    is mostly untouched): 6 threads with a 64 MiB buffer each must not leave 384 MiB mapped."""
    import threading

    k = 1 << 24  # one weight row of 16 Mi weights: a caller's buffer of k floats (64 MiB)
    bm = BlockMatrix.quantize_int8(torch.ones(1, k))
    x = torch.ones(1, k)

    def mapped() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[0]) * 4096  # bytes of address space (pages of 4 KiB)

    def call():
        bm.linear(x)  # one output row: one chunk, run in the calling thread

    def threads(count: int) -> None:
        for _ in range(count):
            worker = threading.Thread(target=call)
            worker.start()
            worker.join()

    call()
    threads(6)  # the first threads' allocator arenas and stacks, kept by the C library for reuse
    before = mapped()
    threads(6)
    assert mapped() - before < 2 * (4 * k)  # at most a buffer or two in flight, not one a thread


def random_k_blocks(kind, n: int, k: int, seed: int) -> np.ndarray:
    """Random K-quant super-blocks [n, bytes] with small positive fp16 scales (gguf cannot encode
    K-quants, but decodes them)."""
    size, scale_at = {T.Q4_K: (144, (0, 2)), T.Q5_K: (176, (0, 2)), T.Q6_K: (210, (208,))}[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n * k // 256, size), dtype=np.uint8)
    for at in scale_at:
        raw[:, at : at + 2] = np.frombuffer(
            rng.uniform(0.001, 0.05, len(raw)).astype(np.float16).tobytes(), np.uint8
        ).reshape(-1, 2)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("kind,fmt", [(T.Q4_K, 4), (T.Q5_K, 8), (T.Q6_K, 16)])
def test_k_quant_super_blocks_repack_exactly(kind, fmt):
    """K-quant super-blocks (random bytes, sane scales) unpack to gguf's dequantised values."""
    n, k = 6, 512
    raw = random_k_blocks(kind, n, k, seed=7)
    ref = torch.from_numpy(quants.dequantize(raw, kind).reshape(n, k).astype(np.float32))
    bm = pack_tensor(raw.reshape(-1), kind, (n, k))
    assert bm is not None and bm.fmt == fmt
    assert torch.equal(bm.dequantize(), ref)
    assert pack_tensor(raw.reshape(-1), kind, (n * 4, k // 4)) is None  # rows not whole super-blocks
    if native.available():
        x = torch.randn(3, k, generator=torch.Generator().manual_seed(8))
        assert torch.allclose(bm.linear(x).double(), x.double() @ ref.double().t(), rtol=1e-5, atol=1e-4)


@needs_native
def test_format_16_fuses_with_others_exactly_and_keeps_batch_invariance(scalar_path):
    """A Q6_K part fused with Q4_1 and Q8_0 parts: everything becomes format 16 with the same
    values; the scalar and SIMD paths and every row count agree bit for bit."""
    q6 = pack_tensor(random_k_blocks(T.Q6_K, 8, 256, seed=3).reshape(-1), T.Q6_K, (8, 256))
    q4, ref4 = make(T.Q4_1, n=8, k=256, seed=4)
    q8, ref8 = make(T.Q8_0, n=4, k=256, seed=5)
    fused = BlockMatrix.concat([q4, q6, q8])
    assert fused.fmt == 16 and fused.shape == (20, 256)
    assert torch.equal(fused.dequantize(), torch.cat([ref4, q6.dequantize(), ref8]))
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(6))
    full = fused.linear(x)
    assert all(torch.equal(fused.linear(x[r : r + 1]), full[r : r + 1]) for r in range(7))
    with scalar_path():
        assert torch.equal(fused.linear(x), full)
    back = BlockMatrix.from_tensors(fused.tensors("w"), "w")
    assert back is not None and back.fmt == 16 and torch.equal(back.dequantize(), fused.dequantize())


@needs_native
def test_format_32_carries_plain_float32_weights_on_the_same_kernel(scalar_path):
    """A matrix with no block form (F32, F16, Q2_K...) rides the kernel as format 32: the weights
    as they are; fused with a quantised part, the fused matrix is format 32 too."""
    w = torch.randn(24, 96, generator=torch.Generator().manual_seed(9))
    dense = BlockMatrix.dense(w)
    assert dense.fmt == 32 and torch.equal(dense.dequantize(), w) and torch.equal(dense.rows(torch.tensor([5])), w[5:6])
    x = torch.randn(6, 96, generator=torch.Generator().manual_seed(10))
    full = dense.linear(x)
    assert torch.allclose(full.double(), x.double() @ w.double().t(), rtol=1e-5, atol=1e-5)
    assert all(torch.equal(dense.linear(x[r : r + 1]), full[r : r + 1]) for r in range(6))
    q4, ref4 = make(T.Q4_1, n=8, k=96, seed=11)
    fused = BlockMatrix.concat([q4, dense])
    assert fused.fmt == 32 and torch.equal(fused.dequantize(), torch.cat([ref4, w]))
    with scalar_path():
        assert torch.equal(dense.linear(x), full)
    with pytest.raises(ValueError, match="divisible"):
        BlockMatrix.dense(torch.zeros(2, 20))


# -- int8 activations (precision "int8") ------------------------------------------------------

def random_blocks(fmt: int, n: int, k: int, seed: int = 0) -> BlockMatrix:
    """A BlockMatrix of random q, d, m in format ``fmt`` (format 16: Q6_K-like, m = 0)."""
    g = torch.Generator().manual_seed(seed)
    nb = k // 32
    if fmt == 4:
        q = torch.randint(0, 256, (n, nb * 16), dtype=torch.uint8, generator=g)
    else:
        lo, hi = (-32, 32) if fmt == 16 else (-128, 128)
        q = torch.randint(lo, hi, (n, nb * 32), dtype=torch.int8, generator=g).view(torch.uint8)
    scales = nb * 2 if fmt == 16 else nb
    d = torch.rand(n, scales, generator=g) * 0.02
    m = torch.zeros(n, scales) if fmt == 16 else torch.randn(n, scales, generator=g) * 0.01
    return BlockMatrix(fmt, q, d, m)


@needs_native
@pytest.mark.parametrize("fmt", [4, 8, 16])
@pytest.mark.parametrize("k", [96, 160, 192, 224])  # 3, 5, 6, 7 blocks: groups of four and tails of 1-3
def test_int8_scalar_and_simd_agree_and_rows_are_batch_invariant(fmt, k, scalar_path):
    bm = random_blocks(fmt, 37, k, seed=k)
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(fmt))
    x[4] = 0.0  # an all-zero row quantises with a zero scale
    base = torch.randn(13, 37)
    fast = bm.linear(x, base, precision="int8")
    with scalar_path():
        assert torch.equal(bm.linear(x, base, precision="int8"), fast)
    for r in range(13):  # each row alone, and the rows again in other tiles
        assert torch.equal(bm.linear(x[r : r + 1], base[r : r + 1], precision="int8")[0], fast[r])
    assert torch.equal(bm.linear(x[3:12], base[3:12], precision="int8"), fast[3:12])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(bm.linear(x, base, precision="int8"), fast)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(fast[4], base[4])


@needs_native
@pytest.mark.parametrize("fmt", [4, 8])
@pytest.mark.parametrize("precision", ["float32", "int8"])
@pytest.mark.parametrize("k", [128, 160, 224])  # int8: no tail, tails of 1 and 3 blocks
def test_decode_row_in_weight_row_pairs_equals_one_at_a_time(k, precision, fmt, scalar_path):
    """A lone row of x meets weight rows several at a time (independent chains: format 4 four
    then two at a time in float32, two in int8; format 8 two in float32; set_decode_spans: a
    chunk's groups in one call); each output is the one-at-a-time kernel's, the scalar path's
    and a multi-row call's, bit for bit, with and without a base (N = 23 in chunks of 8: quads,
    a pair and a last row alone)."""
    kernels = native.kernels()
    bm = random_blocks(fmt, 23, k, seed=k)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(k))
    base = torch.randn(3, 23)
    paired = bm.linear(x[:1], base[:1], precision=precision)
    kernels.set_pairs(False)
    try:
        single = bm.linear(x[:1], base[:1], precision=precision)
    finally:
        kernels.set_pairs(True)
    kernels.set_tree_sums(False)  # the quads' four sums one at a time
    try:
        assert torch.equal(bm.linear(x[:1], base[:1], precision=precision), paired)
    finally:
        kernels.set_tree_sums(True)
    bare = bm.linear(x[:1], precision=precision)  # without a base
    kernels.set_decode_spans(False)  # one call a group of weight rows, not a chunk's groups in one
    try:
        assert torch.equal(bm.linear(x[:1], base[:1], precision=precision), paired)
        assert torch.equal(bm.linear(x[:1], precision=precision), bare)
    finally:
        kernels.set_decode_spans(True)
    kernels.set_pairs(False)
    try:
        assert torch.equal(bm.linear(x[:1], precision=precision), bare)
    finally:
        kernels.set_pairs(True)
    with scalar_path():
        slow = bm.linear(x[:1], base[:1], precision=precision)
    assert torch.equal(paired, single) and torch.equal(paired, slow)
    assert torch.equal(bm.linear(x, base, precision=precision)[:1], paired)


def zero_m_gemm(bm: BlockMatrix, x: torch.Tensor, base: torch.Tensor | None, threads: int, zero_m: bool) -> torch.Tensor:
    """x @ W^T (+ base) on the kernels' gemm, the weight described with or without zero_m."""
    rows, n = x.shape[0], bm.shape[0]
    out = torch.empty(rows, n)
    native.kernels().gemm(bm.fmt, bm.q.data_ptr(), bm.d.data_ptr(), bm.m.data_ptr(), n, bm.shape[1], x.data_ptr(), rows,
                          out.data_ptr(), 0 if base is None else base.data_ptr(), threads, False, zero_m)
    return out


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k", [32, 576])
def test_decode_row_skipping_a_zero_m_equals_reading_it(k, threads, scalar_path):
    """Format 8 weights whose m are all 0 (Q8_0), described with zero_m: a decode row's pairs
    multiply q by d and never read m; each output equals the pair kernel's fma(q, d, 0), the
    scalar path's and a 3-row call's, bit for bit, also where products are -0 (zero q, negative
    d, zeros and -0 in x) and with infinities in x (N = 4099: pairs and a last row alone)."""
    kernels = native.kernels()
    n, g = 4099, torch.Generator().manual_seed(k)
    bm = random_blocks(8, n, k, seed=k)
    bm.q[:, ::7] = 0  # zero weights: -0 products where d < 0
    bm.d.mul_(torch.where(torch.rand(bm.d.shape, generator=g) < 0.5, -1.0, 1.0))
    bm.m.zero_()
    x = torch.randn(3, k, generator=g)
    x[0, ::5] = 0.0
    x[0, 1::5] = -0.0
    base = torch.randn(3, n, generator=g)
    for xs, bs in ((x, base), (x, None)):
        skip = zero_m_gemm(bm, xs[:1], None if bs is None else bs[:1], threads, True)
        read = zero_m_gemm(bm, xs[:1], None if bs is None else bs[:1], threads, False)
        kernels.set_zero_m(False)
        try:
            off = zero_m_gemm(bm, xs[:1], None if bs is None else bs[:1], threads, True)
        finally:
            kernels.set_zero_m(True)
        with scalar_path():
            slow = zero_m_gemm(bm, xs[:1], None if bs is None else bs[:1], threads, True)
        rows3 = zero_m_gemm(bm, xs, bs, threads, True)[:1]
        for other in (read, off, slow, rows3):
            assert torch.equal(skip.view(torch.int32), other.view(torch.int32))  # the bits, signed zeros too
    x[0, 3] = float("inf")
    assert torch.equal(zero_m_gemm(bm, x[:1], None, threads, True).isnan(), zero_m_gemm(bm, x[:1], None, threads, False).isnan())
    with pytest.raises(ValueError, match="zero_m"):
        zero_m_gemm(random_blocks(4, 8, 32), x[:1, :32], None, 1, True)


@needs_native
@pytest.mark.parametrize("fmt", [4, 8, 16, 32])
@pytest.mark.parametrize("k", [32, 96, 160])  # 1, 3 and 5 blocks (a tile's step is one block)
def test_verify_tiles_equal_narrow_tiles_scalar_and_one_row(fmt, k, scalar_path):
    """Verify rows in tiles of up to 5 (set_wide_tiles: 5 = one tile, 9 = 5 + 4), two rows
    against two weight rows at once (set_pair_tiles; set_pair_spans and set_tile_spans: a
    chunk's pairs or tiles in one call) and the tiles' horizontal sums four at a time (set_tree_sums), all on by default, give every row the value of tiles of up to 4 rows
    against one weight row, of the scalar path and of the row alone, bit for bit, in every
    format, for every row count 1..11 (N = 19: chunks of 8 leave a weight row without a pair)."""
    kernels = native.kernels()
    if fmt == 32:
        bm = BlockMatrix.dense(torch.randn(19, k, generator=torch.Generator().manual_seed(k)))
    else:
        bm = random_blocks(fmt, 19, k, seed=k + fmt)
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(fmt))
    base = torch.randn(11, 19)
    alone = torch.cat([bm.linear(x[r : r + 1], base[r : r + 1]) for r in range(11)])
    bare = torch.cat([bm.linear(x[r : r + 1]) for r in range(11)])  # without a base
    with scalar_path():
        slow = bm.linear(x, base)
    assert torch.equal(slow, alone)
    try:
        for wide, pair, tree, span in itertools.product((True, False), repeat=4):
            kernels.set_wide_tiles(wide)
            kernels.set_pair_tiles(pair)
            kernels.set_tree_sums(tree)
            kernels.set_pair_spans(span)
            kernels.set_tile_spans(span)
            for rows in range(1, 12):
                assert torch.equal(bm.linear(x[:rows], base[:rows]), alone[:rows]), (wide, pair, tree, span, rows)
                assert torch.equal(bm.linear(x[:rows]), bare[:rows]), (wide, pair, tree, span, rows, "no base")
    finally:
        kernels.set_wide_tiles(True)
        kernels.set_pair_tiles(True)
        kernels.set_tree_sums(True)
        kernels.set_pair_spans(True)
        kernels.set_tile_spans(True)


@needs_native
@pytest.mark.parametrize("fmt", [4, 8])
def test_int8_row_quantiser_rounds_ties_to_even_on_both_paths(fmt, scalar_path):
    """The SIMD quantiser gives the scalar one's int8 values: ties (x / dx exactly k + 0.5) go to
    the even neighbour on both, and the block's largest value maps to +-127."""
    bm = random_blocks(fmt, 8, 64, seed=5)
    ties = torch.arange(-15.5, 16.5, 1.0)  # [32]: -15.5 .. 15.5
    x = torch.stack([
        torch.cat([torch.tensor([127.0]), ties[1:], torch.tensor([-127.0]), ties[1:]]),  # dx = 1 exactly
        torch.cat([ties * 3.0, -ties]),
    ])  # [2, 64]
    fast = bm.linear(x, precision="int8")
    with scalar_path():
        assert torch.equal(bm.linear(x, precision="int8"), fast)
    w = bm.dequantize().double()
    rounded = torch.cat([torch.tensor([127.0]), torch.round(ties[1:]), torch.tensor([-127.0]), torch.round(ties[1:])])
    expected = rounded.double() @ w.t()  # torch.round: half to even, like nearbyintf
    assert torch.allclose(fast[0].double(), expected, rtol=1e-5, atol=1e-3)


@needs_native
@pytest.mark.parametrize("fmt", [4, 8, 16])
def test_int8_error_is_the_quantisation_error(fmt):
    """int8 activations cost accuracy (stated: under 2% of the largest output on random data),
    never correctness: the result tracks the float64 product."""
    bm = random_blocks(fmt, 50, 256, seed=3)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(3))
    expected = x.double() @ bm.dequantize().double().t()
    got = bm.linear(x, precision="int8").double()
    assert ((got - expected).abs().max() / expected.abs().max()).item() < 2e-2
    exact = bm.linear(x).double()
    assert ((exact - expected).abs().max() / expected.abs().max()).item() < 1e-5


@needs_native
def test_int8_leaves_plain_float_matrices_on_float32_math():
    dense = BlockMatrix.dense(torch.randn(24, 64))
    x = torch.randn(5, 64)
    assert torch.equal(dense.linear(x, precision="int8"), dense.linear(x))


def test_unknown_precision_is_an_error():
    bm, _ = make(T.Q8_0, n=8, k=32)
    with pytest.raises(ValueError, match="precision"):
        bm.linear(torch.randn(1, 32), precision="int4")


@needs_native
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("k", [128, 160, 224])  # groups of four blocks only, tails of 1 and 3 blocks
def test_int8_verify_spans_equal_per_tile_path_scalar_and_one_row(kind, k, scalar_path):
    """int8 verify rows in one span call a chunk (set_int8_spans, on by default: tiles by row
    count: one tile up to 10 rows, more in near-equal tiles of at most 10) give every row the value
    of the per-tile driver, of the scalar path and of the row alone, bit for bit, for every row
    count 1..13 and for 65 and 70 rows (the driver's groups of 64), with and without a base, on gguf's own Q4_0 / Q4_1 / Q8_0 blocks (N = 19: a
    chunk's last weight row alone) and on the VNNI path where the CPU has it; the spans' tiles
    with their rows two at a time in one register (set_int8_row_pairs, on) and one at a time."""
    kernels = native.kernels()
    w = np.random.default_rng(k).standard_normal((19, k)).astype(np.float32)
    bm = pack_tensor(quants.quantize(w, kind).reshape(-1), kind, (19, k))
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(k))
    x[5] = 0.0  # an all-zero row quantises with a zero scale
    base = torch.randn(13, 19)
    alone = torch.cat([bm.linear(x[r : r + 1], base[r : r + 1], precision="int8") for r in range(13)])
    bare = torch.cat([bm.linear(x[r : r + 1], precision="int8") for r in range(13)])
    with scalar_path():
        assert torch.equal(bm.linear(x, base, precision="int8"), alone)
    vnni_options = (True, False) if native.info()["int8"] == "avx512-vnni" else (True,)
    try:
        for spans, pairs, vnni in itertools.product((True, False), (True, False), vnni_options):
            kernels.set_int8_spans(spans)
            kernels.set_int8_row_pairs(pairs)
            kernels.set_vnni(vnni)
            for rows in range(1, 14):
                got = bm.linear(x[:rows], base[:rows], precision="int8")
                assert torch.equal(got, alone[:rows]), (spans, pairs, vnni, rows)
                assert torch.equal(bm.linear(x[:rows], precision="int8"), bare[:rows]), (spans, pairs, vnni, rows, "no base")
            assert torch.equal(bm.linear(x[2:11], base[2:11], precision="int8"), alone[2:11])  # 9 rows, offset
        # more rows than one group of the driver (64), still on the kernel (qlinear.GEMM_ROWS):
        # groups of 64 + 6 and 64 + a lone row
        assert qlinear.GEMM_ROWS >= 70
        many = torch.randn(70, k, generator=torch.Generator().manual_seed(1))
        many_base = torch.randn(70, 19)
        kernels.set_int8_spans(True)
        kernels.set_int8_row_pairs(True)
        spans_on = bm.linear(many, many_base, precision="int8")
        assert torch.equal(bm.linear(many[:65], many_base[:65], precision="int8"), spans_on[:65])
        kernels.set_int8_spans(False)
        assert torch.equal(bm.linear(many, many_base, precision="int8"), spans_on)
        for r in (0, 63, 64, 65, 69):
            assert torch.equal(bm.linear(many[r : r + 1], many_base[r : r + 1], precision="int8")[0], spans_on[r]), r
    finally:
        kernels.set_int8_spans(True)
        kernels.set_int8_row_pairs(True)
        kernels.set_vnni(True)


@needs_native
def test_int8_vnni_path_equals_the_avx2_path():
    """Where the CPU has AVX-512 VNNI, vpdpbusd forms the same integer lanes as AVX2's
    maddubs + madd: the two paths (and the scalar one) agree bit for bit."""
    kernels = native.kernels()
    if native.info()["int8"] != "avx512-vnni":
        pytest.skip("this CPU has no AVX-512 VNNI")
    for fmt in (4, 8):
        bm = random_blocks(fmt, 29, 224, seed=fmt)
        x = torch.randn(11, 224, generator=torch.Generator().manual_seed(7))
        vnni = bm.linear(x, precision="int8")
        vnni_row = bm.linear(x[:1], precision="int8")  # a decode row: format 4 in weight-row pairs
        kernels.set_vnni(False)
        try:
            assert native.info()["int8"] == "avx2"
            assert torch.equal(bm.linear(x, precision="int8"), vnni)
            assert torch.equal(bm.linear(x[:1], precision="int8"), vnni_row)
            assert torch.equal(vnni_row[0], vnni[0])
        finally:
            kernels.set_vnni(True)


@needs_native
def test_roofline_probes_do_their_work_and_refuse_bad_operands():
    """The roofline probes (plugins/model_llama/scripts/roofline.py times them): probe_read sums
    the buffer it is given whatever the chunking and threads; probe_fma runs its chains. They
    are a bench-only build (TSSPEC_BUILD_PROBES=1), never in the production extension."""
    assert not hasattr(native.kernels(), "probe_fma")
    kernels = native.probes()
    if kernels is None:
        pytest.skip("the roofline probes' build is absent (install tsspec-gguf with TSSPEC_BUILD_PROBES=1)")
    if native.info()["simd"] != "avx2+fma":
        pytest.skip("the probes need AVX2 + FMA")
    buf = torch.arange(1000, dtype=torch.float32) % 7  # small integers: every order sums exactly
    expected = float(buf.sum())
    for chunks, threads in ((1, 1), (5, 2), (256, 2)):
        assert kernels.probe_read(buf.data_ptr(), buf.numel(), chunks, threads) == expected
    assert kernels.probe_fma(10, 3, 2) > 0
    kernels.probe_int8(10, 3, 2)  # its checksum is the lanes' low bytes: any value
    assert native.int8_rate(1000, 2) > 0
    for bad in ((0, 3, 1), (10, 0, 1)):
        with pytest.raises(ValueError, match="probe_int8"):
            kernels.probe_int8(*bad)
    for bad in ((0, 3, 1), (10, 0, 1)):
        with pytest.raises(ValueError, match="probe_fma"):
            kernels.probe_fma(*bad)
    with pytest.raises(ValueError, match="probe_read"):
        kernels.probe_read(buf.data_ptr(), buf.numel(), 257, 1)
