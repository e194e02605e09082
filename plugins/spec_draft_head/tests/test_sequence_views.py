"""Per-sequence views of one NextN head (``for_sequence``): shared weights, a KV cache each.

Two sequences over one head, their head calls interleaved one by one, draft exactly what each
drafts alone (the same proposals and acceptance; output equal to plain decoding, greedy and
seeded sampling), where the shared head without views mixes their contexts; views share every
weight (the module, the native engine's matrices, layer stack and embedding rows); closing the
speculator frees its view; a third-party head without the member is driven as before."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

import pytest
import torch

from tsspec.protocols import DraftHeadKind
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import (
    assert_views_keep_sequences_apart,
    factory_without_views,
    sequences_alone,
    sequences_interleaved,
)
from tsspec_draft_head import make_draft_head
from tsspec_draft_head.nextn_file import NextNFileHead
from tsspec_draft_head.nextn_model import NextNConfig, NextNModule

sys.path.insert(0, str(Path(__file__).parent))
from tiny_llama import HIDDEN, VOCAB, write_tiny_llama  # noqa: E402

CFG = NextNConfig(hidden_size=HIDDEN, intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, draft_vocab=48)
OPTIONS = SpeculationOptions(spec_type="draft-head", adaptive=False, pmin=0.0, draft=4)
PLAIN = SpeculationOptions(enabled=False)
PROMPTS = ([5, 17, 33, 2, 71, 9, 40, 12, 88, 3], [60, 1, 44, 19, 7, 93, 25, 50])
MAX_TOKENS = 24
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.9, top_k=20, seed=11)}


def _module(seed: int = 0) -> NextNModule:
    gen = torch.Generator().manual_seed(seed)
    module = NextNModule(CFG, VOCAB)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
        module.draft_ids.copy_(torch.randperm(VOCAB, generator=gen)[: CFG.draft_vocab])
    module.requires_grad_(False)
    return module


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """Two loads of one tiny llama file (one sequence each) sharing ONE NextN head."""
    from tsspec_model_llama import load_llama

    path = write_tiny_llama(tmp_path_factory.mktemp("views") / "tiny.gguf", seed=3)
    first, second = load_llama(path), load_llama(path)
    head = NextNFileHead(_module(), first)
    first.draft_head = second.draft_head = head
    return first, second


@pytest.mark.parametrize("sampling", list(SAMPLINGS), ids=list(SAMPLINGS))
def test_two_interleaved_sequences_draft_what_each_drafts_alone(targets, sampling):
    sampling = SAMPLINGS[sampling]
    make = lambda t: make_draft_head(t, OPTIONS)  # noqa: E731
    assert_views_keep_sequences_apart(targets, PROMPTS, make, OPTIONS, max_tokens=MAX_TOKENS, sampling=sampling)


def test_the_shared_head_without_views_mixes_the_two_contexts(targets):
    # what the views fix: both sequences on the one head, interleaved, draft from each other's
    # history (the output stays lossless; the drafts do not match the solo runs')
    make = factory_without_views(lambda t: make_draft_head(t, OPTIONS))

    alone = sequences_alone(targets, PROMPTS, make, OPTIONS, max_tokens=MAX_TOKENS, sampling=SAMPLINGS["greedy"])
    both = sequences_interleaved(targets, PROMPTS, make, OPTIONS, max_tokens=MAX_TOKENS, sampling=SAMPLINGS["greedy"])
    assert [r["tokens"] for r in both] == [r["tokens"] for r in alone]
    assert [r["proposals"] for r in both] != [r["proposals"] for r in alone]


def test_views_share_every_weight_and_own_their_state(targets):
    head = targets[0].draft_head
    a, b = head.for_sequence(), head.for_sequence()
    before = (head.base, head.end, head._k.data_ptr())
    assert a.m is b.m is head.m and a.draft_vocab_ids is head.draft_vocab_ids
    rows = torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(1))
    a.draft_catch_up_and_step([1, 2, 3, 4, 5, 6], rows, 3, compact=True)
    b.draft_catch_up_and_step([7, 8], rows[:2], 40, compact=True)
    assert (a.base, a.end, b.base, b.end) == (3, 9, 40, 42)
    assert (head.base, head.end, head._k.data_ptr()) == before  # the head's own sequence is untouched
    assert a.counts.calls == b.counts.calls == 1 and head.counts.calls >= 2  # the head totals its views' calls
    if head.native:  # one set of int8 matrices, one layer stack, one embedding table
        na, nb = a._native, b._native
        assert na._stack is nb._stack and na.embeddings is nb.embeddings
        for x, y in zip((na._head, na._e_emb, *na._layer), (nb._head, nb._e_emb, *nb._layer)):
            assert x.q.data_ptr() == y.q.data_ptr() and x.d.data_ptr() == y.d.data_ptr()
        assert na._kc.data_ptr() != nb._kc.data_ptr() and na._rope.data_ptr() != nb._rope.data_ptr()
    else:
        assert a._k.data_ptr() != b._k.data_ptr()


def test_the_head_and_its_views_in_threads_count_every_call(targets):
    """The head serving direct calls while views run beside it: its totals lose no update."""
    import threading

    head = targets[0].draft_head
    views = [head.for_sequence() for _ in range(2)]
    calls, rows_run = head.counts.calls, head.counts.rows
    rows = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(4))

    def run(h):
        for i in range(25):
            h.draft_catch_up_and_step([4, 8, 15], rows, 1 + 3 * i, compact=True)

    threads = [threading.Thread(target=run, args=(h,)) for h in (head, *views)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all((v.counts.calls, v.counts.rows) == (25, 75) for v in views)
    assert (head.counts.calls, head.counts.rows) == (calls + 75, rows_run + 225)


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_views_on_either_engine_equal_a_fresh_head(targets, native):
    # a view drafts bit for bit what a head of its own over the same module drafts
    head = targets[0].draft_head
    if native and not head.use_native(True):
        pytest.skip("the compiled kernels were not built")
    try:
        head.use_native(native)
        own = NextNFileHead(head.m, targets[0])
        own.use_native(native)
        view = head.for_sequence()
        assert view.native == own.native == native
        rows = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(2))
        tokens = [4, 8, 15, 16, 23, 42, 7, 1, 9]
        for h in (view, own):
            h.seen = [h.draft_catch_up_and_step(tokens[:6], rows[:6], 0, compact=True)]
            h.seen.append(h.draft_step(tokens[6], rows[6], 6, compact=True))
            h.seen.append(h.draft_catch_up_and_step(tokens[5:9], rows[5:9], 5, compact=True))
        for (la, oa), (lb, ob) in zip(view.seen, own.seen):
            assert torch.equal(la, lb) and torch.equal(oa, ob)
    finally:
        head.use_native(True)


def test_many_speculators_built_and_closed_leave_no_view_behind(targets):
    target = targets[0]
    head = target.draft_head
    rows = torch.randn(8, HIDDEN, generator=torch.Generator().manual_seed(3))
    views = []
    for i in range(60):
        spec = make_draft_head(target, OPTIONS)
        assert spec.head is not head and spec.owns_head
        spec.head.draft_catch_up_and_step(list(range(1, 9)), rows, 1 + i, compact=True)
        assert spec.head.end == 9 + i
        views.append(weakref.ref(spec.head))
        spec.close()
        assert spec.head.end == 0 and spec.head._k.shape[0] == 0  # the cache is freed at close
        if spec.head.native:
            assert spec.head._native.capacity == 0 and spec.head._native._rope.shape[0] == 0
        del spec
    gc.collect()
    assert all(ref() is None for ref in views)
    assert head._shared._native is None or head._native is not None  # one shared engine, no more


class FakeHead:
    """A minimal third-party per-token head without ``for_sequence``: it drafts ``token + 1``."""

    kind = DraftHeadKind.PER_TOKEN
    block_size = 1
    resumes_after_gap = False

    def __init__(self):
        self.closed = self.resets = self.steps = 0

    def draft_step(self, token, h_prev, pos):
        self.steps += 1
        logits = torch.full((VOCAB,), -10.0)
        logits[(int(token) + 1) % VOCAB] = 10.0
        return logits, h_prev.reshape(-1)

    def draft_catch_up(self, tokens, h_rows, start_pos):
        pass

    def reset(self):
        self.resets += 1

    def close(self):  # never called by a speculator that did not make the head
        self.closed += 1


def test_a_head_without_the_member_is_driven_directly(targets):
    target = targets[0]
    real = target.draft_head
    fake = target.draft_head = FakeHead()
    try:
        spec = make_draft_head(target, OPTIONS)
        assert spec.head is fake and not spec.owns_head
        out = generate(target, list(PROMPTS[0]), OPTIONS, max_tokens=12, speculator=spec)
        plain = generate(target, list(PROMPTS[0]), PLAIN, max_tokens=12)
        assert list(out.tokens) == list(plain.tokens) and out.stats.draft_tokens > 0
        assert fake.steps > 0 and fake.closed == 0  # generate closed the speculator, not the shared head
    finally:
        target.draft_head = real
