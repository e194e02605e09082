"""Per-sequence views of the Qwen 3.5 MTP head (``MtpHead.for_sequence``): shared weights, a KV
cache each.

Two sequences over one head, their head calls interleaved one by one, draft exactly what each
drafts alone (the same proposals and acceptance; output equal to plain decoding, greedy and
seeded sampling), where the shared head without views mixes their contexts; views share every
weight (same storage); closing the speculator frees its view; served together through the
scheduler (the paged path), requests draft and accept exactly as when served one at a time."""

from __future__ import annotations

import gc
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
from tsspec_draft_head import make_draft_head

OPTIONS = SpeculationOptions(spec_type="draft-head", adaptive=False, pmin=0.0, draft=4)
MAX_TOKENS = 20
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.9, top_k=20, seed=11)}


@pytest.fixture(scope="module")
def targets(make_target):
    """Two loads of one tiny model (one sequence each) sharing ONE MTP head."""
    first, second = make_target("qwen35"), make_target("qwen35")
    second.draft_head = first.draft_head
    return first, second


@pytest.fixture(scope="module")
def prompts(sequence):
    return sequence[:9], sequence[30:38]


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_two_interleaved_sequences_draft_what_each_drafts_alone(targets, prompts, sampling):
    sampling = SAMPLINGS[sampling]
    make = lambda t: make_draft_head(t, OPTIONS)  # noqa: E731
    assert_views_keep_sequences_apart(targets, prompts, make, OPTIONS, max_tokens=MAX_TOKENS, sampling=sampling)


def test_the_shared_head_without_views_mixes_the_two_contexts(targets, prompts):
    # what the views fix: both sequences on the one head, interleaved, draft from each other's
    # history (the output stays lossless; the drafts do not match the solo runs')
    make = factory_without_views(lambda t: make_draft_head(t, OPTIONS))

    alone = sequences_alone(targets, prompts, make, OPTIONS, max_tokens=MAX_TOKENS, sampling=SAMPLINGS["greedy"])
    both = sequences_interleaved(targets, prompts, make, OPTIONS, max_tokens=MAX_TOKENS, sampling=SAMPLINGS["greedy"])
    assert [r["tokens"] for r in both] == [r["tokens"] for r in alone]
    assert [r["proposals"] for r in both] != [r["proposals"] for r in alone]


def _storages(head) -> set[int]:
    """Storage addresses of every weight tensor the head reads."""
    import attrs

    seen: set[int] = set()
    visited: set[int] = set()

    def walk(obj):
        if id(obj) in visited:
            return
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            seen.add(obj.untyped_storage().data_ptr())
        elif attrs.has(type(obj)):
            for f in attrs.fields(type(obj)):
                walk(getattr(obj, f.name))
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                walk(x)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            for x in vars(obj).values():
                walk(x)

    walk(head.w)
    return seen


def test_views_share_every_weight_and_own_their_state(targets, sequence):
    head = targets[0].draft_head
    a, b = head.for_sequence(), head.for_sequence()
    assert a.w is b.w is head.w and a.trunk is b.trunk is head.trunk
    weights = _storages(head)
    assert len(weights) > 10 and _storages(a) == _storages(b) == weights
    before = (head.base, head.end, head.cache.keys.data_ptr())
    rows = torch.randn(6, head.hidden_size, generator=torch.Generator().manual_seed(1))
    calls = head.counts.calls
    a.draft_catch_up_and_step(sequence[:6], rows, 3)
    b.draft_catch_up_and_step(sequence[6:8], rows[:2], 40)
    assert (a.base, a.end, b.base, b.end) == (3, 9, 40, 42)
    assert (head.base, head.end, head.cache.keys.data_ptr()) == before  # the head's own sequence is untouched
    assert a.cache.keys.data_ptr() != b.cache.keys.data_ptr()
    assert not (weights & {a.cache.keys.untyped_storage().data_ptr(), b.cache.values.untyped_storage().data_ptr()})
    assert a.counts.calls == b.counts.calls == 1 and head.counts.calls == calls + 2  # the head totals its views' calls
    assert a.counts.rows == 6 and b.counts.rows == 2


def test_a_view_drafts_what_the_head_drafts_on_the_same_rows(targets, sequence):
    head = targets[0].draft_head
    view = head.for_sequence()
    rows = torch.randn(9, head.hidden_size, generator=torch.Generator().manual_seed(2))
    seen = []
    for h in (view, head):
        h.reset()
        out = [h.draft_catch_up_and_step(sequence[:6], rows[:6], 0)]
        out.append(h.draft_step(sequence[6], rows[6], 6))
        out.append(h.draft_catch_up_and_step(sequence[5:9], rows[5:9], 5))
        seen.append(out)
    head.reset()
    for (la, oa), (lb, ob) in zip(*seen):
        assert torch.equal(la, lb) and torch.equal(oa, ob)


def test_many_speculators_built_and_closed_leave_no_view_behind(targets, sequence):
    target = targets[0]
    head = target.draft_head
    rows = torch.randn(8, head.hidden_size, generator=torch.Generator().manual_seed(3))
    views = []
    for i in range(40):
        spec = make_draft_head(target, OPTIONS)
        assert spec.head is not head and spec.owns_head and spec.head.w is head.w
        first = spec.head.draft_catch_up_and_step(sequence[:8], rows, 1 + i)
        assert spec.head.end == 9 + i and spec.head.cache.capacity > 0
        views.append(weakref.ref(spec.head))
        spec.close()
        assert spec.head.end == 0 and spec.head.cache.capacity == 0  # the cache is freed at close
        if i == 0:  # a closed view regrows its cache on the next call, as a fresh one
            again = spec.head.draft_catch_up_and_step(sequence[:8], rows, 1)
            assert all(torch.equal(x, y) for x, y in zip(first, again))
            spec.head.close()
        del spec
    gc.collect()
    assert all(ref() is None for ref in views)


def test_concurrent_served_sequences_draft_and_accept_as_alone(make_target, sequence):
    # the serving path: sequences batched on the hybrid's paged KV, each proposing from its own
    # worker thread with its own view of the one MTP head, draft and accept exactly as the same
    # requests served one at a time, and equal plain decoding
    from tsspec_serve.scheduler import FINISHED, Scheduler, SequenceRequest
    from tsspec.testing import plain_tokens

    prompts = [sequence[:9], sequence[30:38], sequence[50:56]]
    samplings = [SAMPLINGS["greedy"], SAMPLINGS["seeded"], SAMPLINGS["greedy"]]
    max_tokens = 12
    target = make_target("qwen35")

    def serve(requests):
        with Scheduler(target, kv_cache_mb=1, block_size=4, max_seqs=3, batch_wait_ms=100) as sched:
            handles = [sched.submit_request(SequenceRequest(p, max_tokens, sampling=s, options=OPTIONS))
                       for p, s in requests]
            assert all(h.wait(120) for h in handles) and all(h.state == FINISHED for h in handles)
            return [(h.result.tokens, h.result.stats.draft_tokens, h.result.stats.accepted_tokens) for h in handles]

    alone = [serve([r])[0] for r in zip(prompts, samplings)]
    together = serve(list(zip(prompts, samplings)))
    for i, (solo, mixed) in enumerate(zip(alone, together)):
        assert list(mixed[0]) == plain_tokens(make_target("qwen35"), prompts[i], max_tokens, samplings[i])
        assert mixed == solo, f"request {i} drafted differently beside the others"
        assert solo[1] > 0
