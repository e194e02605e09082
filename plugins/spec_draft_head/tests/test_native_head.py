"""NativeNextN (the NextN head on the compiled kernels) against the torch module it replaces:
the same drafts and logits within a stated tolerance on a tiny random config, a KV cache that
stays in step through catch-up / rewind / gap restart / growth, the torch fallback, and
speculative == plain with the native head on the embedded model (greedy, seeded sampling)."""

from __future__ import annotations

import pytest
import tsspec_gguf
import torch

from tsspec_gguf import native
from tsspec_draft_head.nextn_file import NATIVE_ENV, NextNFileHead
from tsspec_draft_head.nextn_model import NextNConfig, NextNModule

V, H, K = 100, 64, 48  # target vocabulary, width, draft vocabulary
CFG = NextNConfig(hidden_size=H, intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16, draft_vocab=K)
# native and torch sum in different orders (and the native eh_proj in two halves): logits agree
# to float32 rounding of the layer's sums, far below the gap between distinct logits
TOLERANCE = 1e-4

needs_kernels = pytest.mark.skipif(native.kernels() is None, reason="the compiled kernels were not built")


class _Target:
    def __init__(self, table):
        self.table = table

    def embed(self, ids):
        return self.table[torch.as_tensor(ids, dtype=torch.long)]


def _module(seed: int = 0) -> NextNModule:
    gen = torch.Generator().manual_seed(seed)
    module = NextNModule(CFG, V)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
        module.draft_ids.copy_(torch.randperm(V, generator=gen)[:K])  # unsorted, as FR-Spec writes them
    module.requires_grad_(False)
    module.pack_int8()
    return module


def _heads(seed: int = 0):
    """(torch head, native head) over one module and one embedding table."""
    module = _module(seed)
    table = torch.randn(V, H, generator=torch.Generator().manual_seed(seed + 50))
    reference = NextNFileHead(module, _Target(table))
    reference.use_native(False)
    fast = NextNFileHead(module, _Target(table))
    assert fast.use_native(True) and fast.native
    return reference, fast


def _same(a, b):
    """Compact logits and output rows of two heads agree; the drafts (argmax) are equal."""
    (la, oa), (lb, ob) = a, b
    scale = float(la.abs().max())
    assert la.shape == lb.shape == (K,)
    assert torch.allclose(la, lb, atol=TOLERANCE * scale, rtol=0), float((la - lb).abs().max())
    assert torch.allclose(oa, ob, atol=TOLERANCE * float(oa.abs().max()), rtol=0)
    assert int(la.argmax()) == int(lb.argmax())


def _rows(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, H, generator=torch.Generator().manual_seed(seed))


@needs_kernels
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_native_drafts_equal_the_torch_heads_on_random_inputs(seed):
    reference, fast = _heads(seed)
    gen = torch.Generator().manual_seed(seed + 7)
    tokens = torch.randint(V, (12,), generator=gen).tolist()
    rows = torch.cat([torch.zeros(1, H), _rows(11, seed)])  # rows[p]: the row that predicted tokens[p]
    out = {}
    for head in (reference, fast):  # chained steps on each head's own output, as the speculator does
        logits, last = head.draft_catch_up_and_step(tokens[:9], rows[:9], 0, compact=True)
        seen = [(logits, last)]
        for p in (9, 10, 11):
            token = int(head.draft_vocab_ids[int(logits.argmax())])
            logits, last = head.draft_step(token, last, p, compact=True)
            seen.append((logits, last))
        out[head] = seen
    for a, b in zip(out[reference], out[fast]):
        _same(a, b)


@needs_kernels
def test_compact_logits_are_the_full_vocabulary_ones_at_the_draft_ids():
    _, fast = _heads(3)
    ids = fast.draft_vocab_ids
    assert bool((ids[1:] > ids[:-1]).all())  # ascending: argmax ties go to the lowest id
    full, out_a = fast.draft_catch_up_and_step([5, 6, 7], _rows(3, 1), 4)
    small, out_b = fast.draft_catch_up_and_step([5, 6, 7], _rows(3, 1), 4, compact=True)
    assert full.shape == (V,) and torch.equal(full[ids], small) and torch.equal(out_a, out_b)
    rest = torch.ones(V, dtype=torch.bool)
    rest[ids] = False
    assert bool(torch.isneginf(full[rest]).all())


@needs_kernels
def test_kv_cache_stays_in_step_through_catch_up_rewind_gap_and_growth():
    reference, fast = _heads(4)
    gen = torch.Generator().manual_seed(9)
    tokens = torch.randint(V, (700,), generator=gen).tolist()
    rows = _rows(700, 11)

    def both(fn):
        a, b = fn(reference), fn(fast)
        if a is not None:
            _same(a, b)
        assert (reference.base, reference.end) == (fast.base, fast.end)

    step = lambda p: lambda h: h.draft_step(tokens[p], rows[p], p, compact=True)  # noqa: E731
    fused = lambda s, n: lambda h: h.draft_catch_up_and_step(  # noqa: E731
        tokens[s : s + n], rows[s : s + n], s, compact=True)
    catch_up = lambda s, n: lambda h: h.draft_catch_up(tokens[s : s + n], rows[s : s + n], s)  # noqa: E731
    both(catch_up(0, 6))  # position 0 dropped: the cache holds 1..5
    assert fast.base == 1 and fast.end == 6
    both(step(6))
    both(step(7))  # a chained draft at 7
    both(fused(6, 3))  # rewind: 6, 7 rewritten by what landed, then 8
    both(fused(30, 2))  # a gap: restart at 30
    assert fast.base == 30
    both(fused(31, 1))
    both(fused(10, 4))  # before the base: restart there
    assert fast.base == 10
    both(catch_up(14, 250))  # past the first capacity (256 slots): the cache grows, rows copied over
    both(fused(264, 40))
    both(step(304))
    both(fused(200, 2))  # rewind deep into the grown cache
    reference.reset()
    fast.reset()
    both(step(600))  # after reset: a fresh cache at 600 (a RoPE table grown on demand)


class _HoldingKernels:
    """The compiled kernels (or the head's extension), but ``layers_forward`` and ``head_forward``
    run ``during`` before the real call (the KV cache's address already taken, as a native call
    holds it with the GIL released)."""

    def __init__(self, real, during):
        self._real, self._during = real, during

    def __getattr__(self, name):
        return getattr(self._real, name)

    def layers_forward(self, stack, l0, l1, x, rows, past, k, v, cap, table, threads, int8):
        self._during(k, v, table)
        return self._real.layers_forward(stack, l0, l1, x, rows, past, k, v, cap, table, threads, int8)

    def head_forward(self, desc, emb, emb_rows, slots, h, past, k, v, cap, table, threads, out, logits):
        self._during(k, v, table)
        return self._real.head_forward(desc, emb, emb_rows, slots, h, past, k, v, cap, table, threads, out, logits)


@needs_kernels
def test_a_head_shared_by_two_threads_never_frees_a_cache_a_native_call_holds():
    # the server's sequences share target.draft_head, each proposing in its own worker thread: a
    # second call that grows the cache (or the RoPE table) must wait until the kernels let go of
    # the first call's addresses, not free them under it
    import threading

    _, fast = _heads(7)
    rows, seen = _rows(600, 3), []
    tokens = [t % V for t in range(600)]

    def during(k, v, table):
        if seen:
            return
        seen.append(None)  # the other thread's own call passes straight through
        held = fast._native
        rope = held._rope
        # 600 rows from the same start: the KV cache (256 slots) and the RoPE table (512) grow
        other = threading.Thread(target=fast.draft_catch_up, args=(tokens, rows, 5))
        other.start()
        other.join(timeout=0.5)  # with the head held it cannot run: give it time to try
        seen[0] = other
        # freed under the call: fail here, before the kernels would write through the address
        assert k == held._kc.data_ptr() and v == held._vc.data_ptr() and held._rope is rope

    fast._native._k = _HoldingKernels(fast._native._k, during)
    fast._native._h = _HoldingKernels(fast._native._h, during)
    fast.draft_step(2, rows[0], 5, compact=True)
    (other,) = seen
    other.join(timeout=30)
    assert not other.is_alive()
    assert fast.end == 605 and fast._native.capacity >= 600


def test_torch_fallback_without_the_compiled_kernels(monkeypatch):
    module = _module(5)
    table = torch.randn(V, H)
    monkeypatch.setattr(native, "kernels", lambda: None)
    head = NextNFileHead(module, _Target(table))
    assert not head.native and not head.use_native(True)
    logits, out = head.draft_catch_up_and_step([1, 2, 3], _rows(3, 0), 0)
    assert logits.shape == (V,) and out.shape == (H,) and torch.isfinite(logits[head.draft_vocab_ids]).all()


@needs_kernels
def test_switch_keeps_the_torch_module(monkeypatch):
    monkeypatch.setenv(NATIVE_ENV, "0")
    assert not NextNFileHead(_module(6), _Target(torch.randn(V, H))).native
    monkeypatch.setenv(NATIVE_ENV, "1")
    assert NextNFileHead(_module(6), _Target(torch.randn(V, H))).native


# -- the embedded model with its shipped drafter ---------------------------------------------
@pytest.fixture(scope="module")
def embedded():
    pytest.importorskip("tsspec_drafters_smollm2", reason="the SmolLM2 drafter distribution is not installed")
    import tsspec_drafters_smollm2
    import tsspec_model_llama

    import tsspec_draft_head
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.plugins import PluginHost
    from tsspec.runtime.catalog import build_catalog
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions

    host = PluginHost()
    for module, name in ((tsspec_draft_head, "draft-head"), (tsspec_drafters_smollm2, "drafters-smollm2"),
                         (tsspec_model_llama, "llama"), (tsspec_gguf, "gguf")):
        host.register(module, name)
    catalog = build_catalog(host, discover=False)
    path = embedded_model_path()
    return (catalog, load_model(path, catalog=catalog, options=SpeculationOptions(spec_type="draft-head")),
            load_model(path, catalog=catalog, options=SpeculationOptions(enabled=False)))


@needs_kernels
@pytest.mark.parametrize("sampling", ["greedy", "sampled", "penalty"])
def test_speculative_equals_plain_with_the_native_head_on_the_embedded_model(embedded, sampling):
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.sampling import SamplingParams

    params = {"greedy": SamplingParams(), "sampled": SamplingParams(temperature=0.7, top_k=40, seed=5),
              "penalty": SamplingParams(temperature=0.7, top_k=40, seed=3, repeat_penalty=1.3)}[sampling]
    catalog, with_drafter, bare = embedded
    head = with_drafter.draft_head
    assert head.native
    tok = bare.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name three primary colors."}]),
                     add_special_tokens=False)
    plain = generate(bare, list(ids), SpeculationOptions(enabled=False), max_tokens=20, sampling=params)
    options = SpeculationOptions(spec_type="draft-head", adaptive=False, pmin=0.0, draft=2)
    calls = head.counts.calls
    spec = generate(with_drafter, list(ids), options, max_tokens=20, sampling=params, registry=catalog.speculators)
    assert spec.tokens == plain.tokens
    assert spec.stats.draft_tokens > 0 and head.counts.calls > calls and head.native


# -- the one-call head (head_forward) against the per-op kernels -------------------------------
@needs_kernels
@pytest.mark.parametrize("seed", [0, 3])
def test_one_native_call_equals_the_seven_per_op_calls_bit_for_bit(seed):
    """``NativeNextN.step`` (one ``head_forward`` call) and ``forward`` + ``logits`` (rms_norm,
    gemm, layers_forward calls): the same kernels in the same order, so the same bits, through a
    catch-up without output, chained steps and a rewind."""
    module = _module(seed)
    table = torch.randn(V, H, generator=torch.Generator().manual_seed(seed + 50))
    one, per_op = (NextNFileHead(module, _Target(table)) for _ in range(2))
    assert one.native and per_op.native
    tokens = torch.randint(V, (14,), generator=torch.Generator().manual_seed(seed + 9)).tolist()
    rows = torch.cat([torch.zeros(1, H), _rows(13, seed)])  # [14, H]
    calls = [(tokens[:6], rows[:6], 0, False), (tokens[6:9], rows[6:9], 6, True), (tokens[9:10], rows[9:10], 9, True),
             (tokens[7:12], rows[7:12], 7, True), (tokens[12:14], rows[12:14], 12, True)]  # the 4th rewinds
    for toks, h, start, want in calls:
        a = one._advance_native(toks, h, start, want_last=want)  # (out, logits) or (None, None)
        out = per_op._advance(toks, h, start, want_last=want)  # the per-op path on the same engine kind
        b = (out, per_op._native.logits(out)) if want else (None, None)
        if want:
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        else:
            assert a == (None, None) and b == (None, None)
        assert one.end == per_op.end and one.base == per_op.base
    n = one.end - one.base
    assert torch.equal(one._native._kc[:, :, :n], per_op._native._kc[:, :, :n])
    assert torch.equal(one._native._vc[:, :, :n], per_op._native._vc[:, :, :n])


@needs_kernels
def test_head_forward_rejects_bad_operands():
    _, fast = _heads(4)
    eng = fast._native
    eng.ensure(4, 64)
    h = _rows(2, 1)
    out, logits = torch.empty(H), torch.empty(K)
    table = eng.embeddings.slots([1, 2])[0]
    args = [eng._desc, table.data_ptr(), table.shape[0], [0, 1], h.data_ptr(), 0, eng._kc.data_ptr(),
            eng._vc.data_ptr(), eng.capacity, eng._rope_from(0, 2), 1, out.data_ptr(), logits.data_ptr()]
    eng._h.head_forward(*args)
    # no rows, a negative slot, a slot past the table, past the cache, logits without out
    for i, bad in ((3, []), (3, [0, -1]), (3, [0, table.shape[0]]), (5, eng.capacity), (11, 0)):
        wrong = list(args)
        wrong[i] = bad
        with pytest.raises(ValueError):
            eng._h.head_forward(*wrong)
    with pytest.raises(ValueError, match="one-block stack"):
        eng._h.head_new(eng._k.layers_new((H, 4, 2, 16, 16, 96, 1e-6), []), 1e-6, (1, 1, 1), (8, 1, 1, 1, H, H),
                        (8, 1, 1, 1, H, H), (8, 1, 1, 1, K, H))


def test_embedding_rows_only_grow_and_a_full_table_serves_a_call_of_its_own():
    from tsspec_draft_head.native_head import EmbeddingRows

    table = torch.randn(V, H)
    calls = []

    def embed(ids):
        calls.append(list(ids))
        return table[torch.as_tensor(ids, dtype=torch.long)]

    rows = EmbeddingRows(embed, H, slots=4)
    rows.fill([7, 3, 7])
    shared, slots = rows.slots([3, 7])
    assert calls == [[7, 3]] and slots == [1, 0] and torch.equal(shared[slots], table[[3, 7]])
    assert rows.slots([9, 3])[1] == [2, 1] and calls[-1] == [9]  # one more row; the old ones stay put
    before = shared[:3].clone()
    own, slots = rows.slots([11, 12, 3])  # two new ids, one slot left: this call's own table
    assert own is not shared and slots == [0, 1, 2] and torch.equal(own, table[[11, 12, 3]])
    assert torch.equal(shared[:3], before) and torch.equal(rows([9, 3, 7]), table[[9, 3, 7]])
    # the native call's form: the shared table's address and rows, or a table of the call's own
    assert rows.addressed([3, 9]) == (shared.data_ptr(), 4, [1, 2], None)
    at, count, slots, own = rows.addressed([3, 11, 12])  # two new ids, one slot left
    assert own is not None and (at, count, slots) == (own.data_ptr(), 3, [0, 1, 2])
    assert torch.equal(own, table[[3, 11, 12]])


@needs_kernels
def test_native_logits_match_the_torch_module_on_real_rows_of_the_embedded_model(embedded):
    """The shipped drafter on the embedded model's own hidden rows: the one-call kernels'
    compact logits within TOLERANCE of their scale of the torch module's, and the same top-1
    wherever the torch module's top two logits are further apart than that."""
    _, with_drafter, _ = embedded
    head = with_drafter.draft_head
    tok = with_drafter.tokenizer
    ids = [int(i) for i in tok.encode("The lighthouse keeper climbed the stairs at dusk to light the lamp, "
                                      "as he had done every evening for thirty years.")]
    _, hidden = with_drafter.spec_forward(ids, all_logits_rows=True, want_hidden=True)  # [n, H]
    try:
        results = {}
        for native_on in (False, True):
            assert head.use_native(native_on) == native_on
            got = []
            for p in range(1, len(ids)):  # row p-1 predicted ids[p]
                got.append(head.draft_catch_up_and_step([ids[p]], hidden[p - 1 : p], p, compact=True))
            results[native_on] = got
    finally:
        head.use_native(True)
    agree = 0
    for (lt, _), (ln, _) in zip(results[False], results[True]):
        scale = float(lt.abs().max())
        assert torch.allclose(lt, ln, atol=TOLERANCE * scale, rtol=0), float((lt - ln).abs().max()) / scale
        top2 = torch.topk(lt, 2).values
        if float(top2[0] - top2[1]) > 2 * TOLERANCE * scale:
            assert int(lt.argmax()) == int(ln.argmax())
        agree += int(lt.argmax()) == int(ln.argmax())
    assert agree >= len(results[True]) - 1  # measured: every one of 22 (max difference 5e-7 of the scale)
    # the kernel thread count (ThreadChoice picks it by timing) never changes a bit
    by_threads = {}
    for threads in (1, 2):
        head.reset()
        head._native.threads = threads
        by_threads[threads] = [head.draft_catch_up_and_step(ids[p : p + 2], hidden[p - 1 : p + 1], p, compact=True)
                               for p in range(1, len(ids) - 1, 2)]
    head._native.threads = None
    for (la, oa), (lb, ob) in zip(by_threads[1], by_threads[2]):
        assert torch.equal(la, lb) and torch.equal(oa, ob)


def test_thread_choice_keeps_the_faster_count_and_measures_again_later():
    from tsspec_draft_head.native_head import ThreadChoice

    choice = ThreadChoice()
    assert choice.pick(1) == (1, False)  # one thread: nothing to choose
    cost = {1: 300, 2: 500}  # ns a call: one thread wins here
    seen = []
    while not choice.chosen:
        threads, timed = choice.pick(2)
        assert timed
        seen.append(threads)
        choice.record(threads, cost[threads], 2)
    assert seen == [1, 2] * ThreadChoice.TRIALS and choice.chosen == 1
    assert all(choice.pick(2) == (1, False) for _ in range(ThreadChoice.EVERY))
    cost = {1: 900, 2: 400}  # the load changed: the next round picks two
    while True:
        threads, timed = choice.pick(2)
        assert timed
        choice.record(threads, cost[threads], 2)
        if choice.pick(2) == (2, False):
            break
    assert choice.chosen == 2


@needs_kernels
def test_switches_one_call_and_thread_choice_off_draft_the_same_bits(monkeypatch):
    from tsspec_draft_head.native_head import ONE_CALL_ENV, THREAD_CHOICE_ENV

    module = _module(8)
    table = torch.randn(V, H, generator=torch.Generator().manual_seed(58))
    default = NextNFileHead(module, _Target(table))
    monkeypatch.setenv(ONE_CALL_ENV, "0")
    monkeypatch.setenv(THREAD_CHOICE_ENV, "0")
    switched = NextNFileHead(module, _Target(table))
    assert not switched._native.one_call and switched._native.thread_choice is None
    assert default._native.one_call and default._native.thread_choice is not None
    tokens, rows = [3, 9, 27, 81 % V], _rows(4, 8)
    a = default.draft_catch_up_and_step(tokens, rows, 5, compact=True)
    b = switched.draft_catch_up_and_step(tokens, rows, 5, compact=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# -- the gate inside the head's native call (head_forward's gate operands, draft_gated) -------
@needs_kernels
@pytest.mark.parametrize("seed", [0, 3])
def test_gate_in_the_native_call_equals_head_forward_then_top1_topk_bit_for_bit(seed):
    """``head_forward(..., gate_n, gate_k)`` writes the same output row and logits as without
    the gate operands, and returns what ``top1_topk`` returns on logits[:gate_n]."""
    _, fast = _heads(seed)
    eng = fast._native
    eng.ensure(8, 64)
    k = eng._k
    h = _rows(3, seed + 1)  # [3, H]
    table = eng.embeddings.slots([4, 9, 17])[0]
    slots = eng.embeddings.slots([4, 9, 17])[1]
    for gate_n, gate_k in ((K, 10), (K - 5, 10), (1, 10), (K, 1), (7, 64)):
        kc, vc = eng._kc.clone(), eng._vc.clone()  # each call writes the same rows from slot 2
        outs = []
        for gated in (False, True):
            eng._kc.copy_(kc)
            eng._vc.copy_(vc)
            out, logits = torch.empty(H), torch.empty(K)
            extra = (gate_n, gate_k) if gated else ()
            res = eng._h.head_forward(eng._desc, table.data_ptr(), table.shape[0], slots, h.data_ptr(), 2,
                                 eng._kc.data_ptr(), eng._vc.data_ptr(), eng.capacity, eng._rope_from(0, 5), 1,
                                 out.data_ptr(), logits.data_ptr(), *extra)
            outs.append((res, out, logits, eng._kc.clone()))
        (none, out_a, logits_a, kc_a), (gate, out_b, logits_b, kc_b) = outs
        assert none is None and torch.equal(out_a, out_b) and torch.equal(logits_a, logits_b) and torch.equal(kc_a, kc_b)
        want = k.top1_topk(logits_a.data_ptr(), gate_n, gate_k)
        assert gate == want and isinstance(gate[0], int) and 0 <= gate[0] < gate_n
        # the last row's predecessor read from an address of its own (h_last): the same bits
        eng._kc.copy_(kc)
        eng._vc.copy_(vc)
        apart = h[2].clone()
        out_c, logits_c = torch.empty(H), torch.empty(K)
        res = eng._h.head_forward(eng._desc, table.data_ptr(), table.shape[0], slots, h[:2].contiguous().data_ptr(), 2,
                             eng._kc.data_ptr(), eng._vc.data_ptr(), eng.capacity, eng._rope_from(0, 5), 1,
                             out_c.data_ptr(), logits_c.data_ptr(), gate_n, gate_k, apart.data_ptr())
        assert res == gate and torch.equal(out_c, out_a) and torch.equal(logits_c, logits_a)
        assert torch.equal(eng._kc, kc_a)


@needs_kernels
def test_head_forward_rejects_bad_gate_operands():
    _, fast = _heads(4)
    eng = fast._native
    eng.ensure(4, 64)
    h = _rows(1, 1)
    out, logits = torch.empty(H), torch.empty(K)
    table, slots = eng.embeddings.slots([1])
    args = [eng._desc, table.data_ptr(), table.shape[0], slots, h.data_ptr(), 0, eng._kc.data_ptr(),
            eng._vc.data_ptr(), eng.capacity, eng._rope_from(0, 1), 1, out.data_ptr(), logits.data_ptr()]
    assert eng._h.head_forward(*args, 0, 0) is None  # gate_k 0: no gate
    for gate_n, gate_k in ((0, 10), (K + 1, 10), (K, 65), (K, -1)):
        with pytest.raises(ValueError, match="gate"):
            eng._h.head_forward(*args, gate_n, gate_k)
    with pytest.raises(ValueError, match="gate"):  # a gate needs the logits
        eng._h.head_forward(*args[:12], 0, K, 10)
    no_rows = list(args)
    no_rows[4] = 0
    with pytest.raises(ValueError):  # no rows at all
        eng._h.head_forward(*no_rows)
    assert eng._h.head_forward(*no_rows, K, 10, h[0].data_ptr()) is not None  # one row, read from h_last
    two = list(no_rows)
    two[3] = slots * 2
    with pytest.raises(ValueError):  # two rows need h for the first
        eng._h.head_forward(*two, K, 10, h[0].data_ptr())


@needs_kernels
@pytest.mark.parametrize("seed", [1, 5])
@pytest.mark.parametrize("engine", ["native", "torch"])
@pytest.mark.parametrize("form", ["rows", "last"])
def test_draft_gated_equals_the_compact_step_and_the_gate_bit_for_bit(seed, engine, form):
    """``draft_gated`` (on the kernels: one native call, the gate inside, output rows in the
    head's buffers; on the torch engine: the two calls) against
    ``draft_catch_up_and_step(compact=True)`` + ``top1_over_topk`` on another head over the
    same module: a fused catch-up, chained steps on the returned row, a rewind, a gap, a cut
    under K, a call from position 0. ``form`` "last": the last row passed apart, the others
    as the leading rows of a longer buffer (None for one row)."""
    from tsspec_draft_head.confidence import top1_over_topk

    module = _module(seed)
    table = torch.randn(V, H, generator=torch.Generator().manual_seed(seed + 50))
    want_head, got_head = NextNFileHead(module, _Target(table)), NextNFileHead(module, _Target(table))
    for head in (want_head, got_head):
        assert head.use_native(engine == "native") == (engine == "native")
    tokens = torch.randint(V, (40,), generator=torch.Generator().manual_seed(seed)).tolist()
    rows = _rows(40, seed + 2)
    calls = [(0, 5, K), (5, 1, K), (6, 1, K - 3), (7, 1, K), (5, 3, K), (20, 2, K), (22, 1, 1)]  # (start, rows, cut)
    chained = {}  # position -> (the reference's output row, draft_gated's) of the call before it
    for start, n, cut in calls:
        h_want = h_got = rows[start : start + n]
        if n == 1 and start in chained:  # chain the row the previous call returned, as the speculator does
            h_want, h_got = (row.reshape(1, -1) for row in chained[start])
        logits, out = want_head.draft_catch_up_and_step(tokens[start : start + n], h_want, start, compact=True)
        want = top1_over_topk(logits[:cut])
        if form == "rows":
            index, probability, last = got_head.draft_gated(tokens[start : start + n], h_got, start, cut)
        else:
            buffer = None if n == 1 else torch.cat([h_got[: n - 1], torch.full((3, H), float("nan"))])  # [n + 2, H]
            index, probability, last = got_head.draft_gated(tokens[start : start + n], buffer, start, cut,
                                                            last=h_got[n - 1].clone())
        assert (index, probability) == want and torch.equal(last, out)
        assert (got_head.base, got_head.end) == (want_head.base, want_head.end)
        chained[start + n] = (out, last)
    assert got_head.counts.calls == want_head.counts.calls == len(calls)


@needs_kernels
def test_draft_gated_takes_the_reference_gate_where_the_kernel_leaves_it(monkeypatch):
    """NaN logits: the kernel's gate returns None and the head gives the torch gate's answer."""
    from tsspec_draft_head.confidence import top1_over_topk_torch

    _, fast = _heads(2)
    fast._native._head_norm.fill_(float("nan"))  # the engine's own copy (not the module's)
    index, probability, _ = fast.draft_gated([3, 4], _rows(2, 0), 3, K)
    logits = fast._native._gate_logits
    assert torch.isnan(logits).all()
    assert (index, probability != probability) == (top1_over_topk_torch(logits)[0], True)


@needs_kernels
@pytest.mark.parametrize("why", ["top_k", "one_call"])
def test_draft_gated_takes_the_two_calls_where_the_native_gate_does_not_apply(why):
    """A gate over more than the kernel's 64 candidates, or the per-op attribution mode
    (TS_MTP_ONE_CALL=0): the same answers through the two calls, never a fault."""
    from tsspec_draft_head.confidence import top1_over_topk

    _, want_head = _heads(3)
    _, got_head = _heads(3)  # two native heads over equal modules: the same arithmetic
    top_k = 100 if why == "top_k" else 10
    if why == "one_call":
        got_head._native.one_call = False
    rows = _rows(3, 1)
    logits, out = want_head.draft_catch_up_and_step([3, 4, 5], rows, 3, compact=True)
    index, probability, last = got_head.draft_gated([3, 4, 5], rows, 3, K, top_k)
    assert (index, probability) == top1_over_topk(logits[:K], top_k) and torch.equal(last, out)


class _WithoutGatedCall:
    """A NextN head without ``draft_gated``: the speculator gates the logits itself."""

    def __init__(self, head):
        self._head = head

    def __getattr__(self, name):
        if name == "draft_gated":
            raise AttributeError(name)
        return getattr(self._head, name)


@needs_kernels
@pytest.mark.parametrize("engine", ["native", "torch"])
def test_the_speculator_drafts_the_same_with_the_gate_in_the_head(engine):
    """DraftHeadSpeculator over a head with ``draft_gated`` (the head call and the gate in one)
    and over the same weights without it: the same drafts and confidences through fused
    catch-ups, chains of three and a bound of 2 pending rows, and the same head calls."""
    from tsspec.protocols import DraftContext
    from tsspec_draft_head import DraftHeadSpeculator

    module = _module(9)
    table = torch.randn(V, H, generator=torch.Generator().manual_seed(59))
    heads = [NextNFileHead(module, _Target(table)) for _ in range(2)]
    for head in heads:
        assert head.use_native(engine == "native") == (engine == "native")
    class Recording(DraftHeadSpeculator):
        def _keeps(self, probability):
            self.probabilities.append(probability)  # every gate's probability, kept or not
            return super()._keeps(probability)

    runs = []
    for head in (heads[0], _WithoutGatedCall(heads[1])):
        spec = Recording(head, max_draft_tokens=3, feature_size=H, min_draft_prob=0.3, catch_up_rows=2)
        spec.probabilities = []
        assert spec._gated == (head is heads[0])
        gen = torch.Generator().manual_seed(4)
        history = torch.randint(V, (6,), generator=gen).tolist()
        rows = _rows(80, 21)  # rows[p]: the trunk row that predicted position p + 1
        spec.commit(history[:-1], torch.cat([torch.zeros(1, H), rows[:4]]), 0)
        seen = []
        for _ in range(12):
            p = len(history) - 1
            ctx = DraftContext(last_token=history[-1], position=p, max_tokens=3, history=tuple(history),
                               carry_hidden=rows[p - 1], vocab_size=V - 1)  # the cut leaves out the top id
            drafts = spec.propose(ctx)
            seen.append(list(drafts))
            kept = [history[-1], *drafts[: p % 3]]  # 0, 1 or 2 drafts land
            spec.commit(kept, rows[p - 1 : p - 1 + len(kept)], p)
            history += drafts[: p % 3] + [int(torch.randint(V - 1, (1,), generator=gen))]
        runs.append((seen, spec.probabilities, spec.counters.head_calls, head.counts.rows))
    assert runs[0] == runs[1]
    lengths = [len(d) for d in runs[0][0]]
    assert 0 in lengths and 3 in lengths and sum(lengths) > 6, lengths  # the gate stopped some chains


@needs_kernels
def test_rows_that_only_feed_the_cache_give_the_whole_blocks_bits():
    """``head_forward`` runs only the block's first half (norm, QKV, RoPE, cache) on the rows
    whose output is not wanted: the KV cache and the last row's output and logits equal the
    per-op path's (the whole block on every row, ``layers_forward``) bit for bit, over more
    rows than one attention slice (64) and from a past of 0 and beyond."""
    module = _module(11)
    table = torch.randn(V, H, generator=torch.Generator().manual_seed(61))
    one, per_op = (NextNFileHead(module, _Target(table)) for _ in range(2))
    tokens = torch.randint(V, (160,), generator=torch.Generator().manual_seed(12)).tolist()
    rows = _rows(160, 13)
    for start, n, want in ((1, 70, True), (71, 3, False), (74, 2, True), (40, 80, True)):
        a = one._advance_native(tokens[start : start + n], rows[start : start + n], start, want_last=want)
        out = per_op._advance(tokens[start : start + n], rows[start : start + n], start, want_last=want)
        if want:
            assert torch.equal(a[0], out) and torch.equal(a[1], per_op._native.logits(out))
        filled = one.end - one.base
        assert torch.equal(one._native._kc[:, :, :filled], per_op._native._kc[:, :, :filled])
        assert torch.equal(one._native._vc[:, :, :filled], per_op._native._vc[:, :, :filled])
