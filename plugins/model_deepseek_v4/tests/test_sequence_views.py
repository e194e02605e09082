"""Per-sequence views of DeepSeek V4's in-checkpoint heads (``for_sequence``): the MTP block
(``draft-head``) and the DSpark block drafter (``block``), shared weights, sequence state each.

For either head, two sequences over one head, their head calls interleaved one by one, draft
exactly what each drafts alone (the same proposals and acceptance; output equal to plain
decoding, greedy and seeded sampling), where the shared head without views mixes their
contexts; views share every weight (same storage); closing the speculator frees its view; the
RoPE table the views share grows safely from several threads."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import (
    assert_views_keep_sequences_apart,
    factory_without_views,
    sequences_alone,
    sequences_interleaved,
)

MAX_TOKENS = 14
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.9, top_k=20, seed=11)}
OPTIONS = {
    "mtp": SpeculationOptions(spec_type="draft-head", adaptive=False, pmin=0.0, draft=4),
    "dspark": SpeculationOptions(spec_type="block", adaptive=False, pmin=0.0),
}


def _factory(kind: str):
    if kind == "mtp":
        from tsspec_draft_head import make_draft_head

        return lambda t: make_draft_head(t, OPTIONS["mtp"])
    from tsspec_block.speculator import make_block_speculator

    return lambda t: make_block_speculator(t, OPTIONS["dspark"])


@pytest.fixture(scope="module")
def heads(converted, make_target):
    """heads(kind) -> two targets (one sequence each) sharing ONE head of that kind."""
    from tsspec_model_deepseek_v4.loader import load_from_source
    from tsspec_model_deepseek_v4.random_dspark import random_dspark
    from tsspec_model_deepseek_v4.source import MemorySource

    cache: dict[str, tuple] = {}

    def get(kind: str):
        if kind not in cache:
            if kind == "mtp":
                first, second = make_target(), make_target()
            else:
                arch, meta, tensors = converted
                a, m, t = random_dspark(meta, tensors, convention="embedded", head_type="gated")
                first, second = (load_from_source(MemorySource(a, m, t)) for _ in range(2))
            second.draft_head = first.draft_head
            cache[kind] = (first, second)
        return cache[kind]

    return get


@pytest.fixture(scope="module")
def prompts(sequence):
    return sequence[:9], sequence[24:32]


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("kind", ["mtp", "dspark"])
def test_two_interleaved_sequences_draft_what_each_drafts_alone(heads, prompts, kind, sampling):
    targets, sampling, make = heads(kind), SAMPLINGS[sampling], _factory(kind)
    assert_views_keep_sequences_apart(targets, prompts, make, OPTIONS[kind], max_tokens=MAX_TOKENS, sampling=sampling)


@pytest.mark.parametrize("kind", ["mtp", "dspark"])
def test_the_shared_head_without_views_mixes_the_two_contexts(heads, prompts, kind):
    # what the views fix: both sequences on the one head, interleaved, draft from each other's
    # history (the output stays lossless; the drafts do not match the solo runs')
    targets, base = heads(kind), _factory(kind)
    make = factory_without_views(base)

    alone = sequences_alone(targets, prompts, make, OPTIONS[kind], max_tokens=MAX_TOKENS, sampling=SAMPLINGS["greedy"])
    both = sequences_interleaved(targets, prompts, make, OPTIONS[kind], max_tokens=MAX_TOKENS, sampling=SAMPLINGS["greedy"])
    assert [r["tokens"] for r in both] == [r["tokens"] for r in alone]
    assert [r["proposals"] for r in both] != [r["proposals"] for r in alone]


def _storages(obj, seen=None, visited=None) -> set[int]:
    """Storage addresses of every tensor reachable from ``obj`` (attrs classes, lists, objects)."""
    import attrs

    seen = set() if seen is None else seen
    visited = set() if visited is None else visited
    if id(obj) in visited:
        return seen
    visited.add(id(obj))
    if isinstance(obj, torch.Tensor):
        seen.add(obj.untyped_storage().data_ptr())
    elif attrs.has(type(obj)):
        for f in attrs.fields(type(obj)):
            _storages(getattr(obj, f.name), seen, visited)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _storages(x, seen, visited)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for x in vars(obj).values():
            _storages(x, seen, visited)
    return seen


def test_mtp_views_share_every_weight_and_own_their_state(heads, sequence):
    head = heads("mtp")[0].draft_head
    a, b = head.for_sequence(), head.for_sequence()
    assert a.w is b.w is head.w and a.trunk is b.trunk is head.trunk
    weights = _storages(head.w)
    assert len(weights) > 10 and _storages(a.w) == _storages(b.w) == weights
    before = (head.base, head.end, head.cache.kv.data_ptr())
    rows = torch.randn(6, head.feature_size, generator=torch.Generator().manual_seed(1))
    calls = head.counts.calls
    a.draft_catch_up_and_step(sequence[:6], rows, 3)
    b.draft_catch_up_and_step(sequence[6:8], rows[:2], 30)
    assert (a.base, a.end, b.base, b.end) == (3, 9, 30, 32)
    assert (head.base, head.end, head.cache.kv.data_ptr()) == before  # the head's own sequence is untouched
    assert a.cache.kv.data_ptr() != b.cache.kv.data_ptr() and not (weights & _storages(a.cache))
    assert a.counts.calls == b.counts.calls == 1 and head.counts.calls == calls + 2  # the head totals its views' calls
    assert a.counts.rows == 6 and b.counts.rows == 2


def test_dspark_views_share_every_weight_and_own_their_context(heads, sequence):
    head = heads("dspark")[0].draft_head
    a, b = head.for_sequence(), head.for_sequence()
    assert a.w is b.w is head.w and a.cfg is head.cfg and a.target is head.target
    weights = _storages(head.w)
    assert len(weights) > 10 and _storages(a.w) == weights
    held = [t.data_ptr() for t in head._ctx]
    rows = torch.randn(8, head.feature_size, generator=torch.Generator().manual_seed(1))
    a.draft_catch_up(sequence[:8], rows, 0)
    assert a._valid[:7].all() and b._valid.numel() == 0
    assert [t.data_ptr() for t in head._ctx] == held  # the head's own context is untouched
    assert not (weights & _storages(a._ctx)) and not (_storages(a._ctx) & _storages(b._ctx))
    calls = head.counts.calls
    a.draft_block(sequence[8], rows[-1], 8, 3)
    b.draft_block(sequence[8], rows[-1], 8, 3)
    assert a.counts.calls == b.counts.calls == 1 and head.counts.calls == calls + 2


@pytest.mark.parametrize("kind", ["mtp", "dspark"])
def test_a_view_drafts_what_a_fresh_head_drafts(heads, sequence, kind):
    # the view beside a long-used head drafts bit for bit what the head drafts after a reset
    head = heads(kind)[0].draft_head
    view = head.for_sequence()
    rows = torch.randn(10, head.feature_size, generator=torch.Generator().manual_seed(2))
    seen = []
    for h in (view, head):
        h.reset()
        if kind == "mtp":
            out = [h.draft_catch_up_and_step(sequence[:6], rows[:6], 0), h.draft_step(sequence[6], rows[6], 6),
                   h.draft_catch_up_and_step(sequence[5:9], rows[5:9], 5)]
            seen.append([t for pair in out for t in pair])
        else:
            h.draft_catch_up(sequence[:9], rows[:9], 0)
            seen.append([h.block_rows(sequence[9], 9), h.draft_block(sequence[9], rows[9], 9, 3)])
    head.reset()
    for x, y in zip(*seen):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


@pytest.mark.parametrize("kind", ["mtp", "dspark"])
def test_many_speculators_built_and_closed_leave_no_view_behind(heads, sequence, kind):
    target = heads(kind)[0]
    head, make = target.draft_head, _factory(kind)
    rows = torch.randn(8, head.feature_size, generator=torch.Generator().manual_seed(3))
    views = []
    for i in range(30):
        spec = make(target)
        assert spec.head is not head and spec.owns_head and spec.head.w is head.w
        view = spec.head
        if kind == "mtp":
            first = view.draft_catch_up_and_step(sequence[:8], rows, 1 + i)
            assert view.end == 9 + i and view.cache.kv.shape[0] > 0
        else:
            view.draft_catch_up(sequence[:8], rows, 1 + i)
            first = view.block_rows(sequence[8], 9 + i), view.draft_block(sequence[8], rows[-1], 9 + i, 3)
            assert view._valid.numel() >= 8 + i and view._ctx[0].shape[0] > 0
        views.append(weakref.ref(view))
        spec.close()
        if i == 0:  # a closed view regrows its state on the next call, as a fresh one
            if kind == "mtp":
                again = view.draft_catch_up_and_step(sequence[:8], rows, 1)
            else:
                view.draft_catch_up(sequence[:8], rows, 1)
                again = view.block_rows(sequence[8], 9), view.draft_block(sequence[8], rows[-1], 9, 3)
            assert torch.equal(first[0], again[0]) and (first[1] == again[1] if kind == "dspark"
                                                        else torch.equal(first[1], again[1]))
            view.close()
        if kind == "mtp":  # the cache is freed at close
            assert view.end == 0 and view.cache.kv.shape[0] == 0
        else:
            assert view._valid.numel() == 0 and all(t.shape[0] == 0 for t in view._ctx)
        del spec, view
    gc.collect()
    assert all(ref() is None for ref in views)


def test_the_shared_rope_table_grows_safely_from_many_threads():
    from tsspec_model_deepseek_v4.ops import TailRope

    want = TailRope(8, 10000.0, torch.float32)
    expected = [want.tables(torch.tensor([p])) for p in range(300)]  # one position at a time
    for _ in range(3):
        rope, errors = TailRope(8, 10000.0, torch.float32), []
        barrier = threading.Barrier(6)

        def ask(top: int):
            try:
                barrier.wait()
                for end in range(1, top):
                    cos, sin = rope.tables(torch.arange(end - 1, end))
                    assert torch.equal(cos[0], expected[end - 1][0][0]) and torch.equal(sin[0], expected[end - 1][1][0])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=ask, args=(50 * (i + 1),)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[0]
