"""Per-sequence views of one DFlash head (``for_sequence``): shared weights, a context each.

Two sequences driven through one head, their calls interleaved step by step, draft exactly
what each drafts alone (where the shared head without views mixes them); views share every
weight; the factory gives each speculator its own view and closing it frees the view; a head
without the member is driven (and reset at close) as before."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from tsspec.protocols import DraftHeadKind
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.testing import ToyTarget

from tsspec_block.attach import attach_dflash
from tsspec_block.speculator import make_block_speculator

TOY = dict(hidden_size=16, target_layers=[1, 2], mask_token_id=31, num_layers=2, block_size=6, sliding_window=8)
OPTIONS = SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False)


@pytest.fixture
def head(tmp_path, drafter_file):
    return attach_dflash(ToyTarget(), drafter_file(tmp_path / "d.gguf", **TOY))


def _sequence(head, seed: int, length: int = 14):
    """(tokens, feature rows [length, F]) of one made-up sequence."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 30, (length,), generator=gen).tolist()
    return tokens, torch.randn(length, head.feature_size, generator=gen)


def _steps(seq, start: int = 6, step: int = 2):
    """The calls one sequence makes: a prefill catch-up, then (catch-up, draft) pairs."""
    tokens, rows = seq
    calls = [("catch_up", tokens[:start], rows[:start], 0)]
    for p in range(start, len(tokens) - step, step):
        calls.append(("catch_up", tokens[p : p + step], rows[p : p + step], p))
        calls.append(("draft", tokens[p + step - 1], rows[p + step - 1], p + step))
    return calls


def _do(head, call):
    kind, a, b, c = call
    if kind == "catch_up":
        head.draft_catch_up(a, b, c)
        return None
    return head.draft_block(a, b, c, 5)


def _drive(heads, sequences, interleaved: bool):
    """Each sequence's drafts, its calls run one after the other or alternating."""
    plans = [_steps(s) for s in sequences]
    out: list[list] = [[] for _ in plans]
    order = ([(i, c) for pair in zip(*plans) for i, c in enumerate(pair)] if interleaved
             else [(i, c) for i, plan in enumerate(plans) for c in plan])
    for i, call in order:
        drafted = _do(heads[i], call)
        if drafted is not None:
            out[i].append(drafted)
    return out


def test_interleaved_views_draft_what_each_drafts_alone(head):
    sequences = [_sequence(head, 1), _sequence(head, 2)]
    alone = _drive([head.for_sequence(), head.for_sequence()], sequences, interleaved=False)
    mixed = _drive([head.for_sequence(), head.for_sequence()], sequences, interleaved=True)
    assert mixed == alone and all(alone)
    # the one shared head, interleaved, drafts from both sequences' rows at once
    shared = _drive([head, head], sequences, interleaved=True)
    assert shared != alone


def test_views_share_every_weight_and_own_their_context(head):
    a, b = head.for_sequence(), head.for_sequence()
    assert a.weights is b.weights is head.weights and a.config is head.config
    assert a.kernels_used is head.kernels_used  # what ran is recorded once, for --stats
    assert all(x is not y for x, y in zip(a._stores, b._stores))
    tokens, rows = _sequence(head, 3)
    a.draft_catch_up(tokens[:8], rows[:8], 0)
    assert a._seen_end == 7 and b._seen_end == 0 and head._seen_end == 0
    calls, rows_run = head.counts.calls, head.counts.rows
    a.draft_block(tokens[8], rows[8], 9, 3)
    b.draft_block(tokens[8], rows[8], 9, 3)
    assert a.counts.calls == b.counts.calls == 1 and a.counts.rows == head.block_size
    assert (head.counts.calls, head.counts.rows) == (calls + 2, rows_run + 2 * head.block_size)  # the totals


def test_each_speculator_gets_a_view_freed_at_close(head):
    target = head.target
    tokens, rows = _sequence(head, 4)
    refs = []
    for _ in range(40):
        spec = make_block_speculator(target, OPTIONS)
        assert spec.head is not head and spec.owns_head and spec.head.weights is head.weights
        spec.commit(tokens[:8], rows[:8], 0)
        spec._flush()
        held = spec.head._stores
        spec.close()
        assert spec.head._seen_end == 0 and spec.head._stores is not held  # fresh, empty stores
        refs.append(weakref.ref(spec.head))
        del spec, held
    gc.collect()
    assert all(r() is None for r in refs)


def test_views_are_lossless_through_the_loop(tmp_path, drafter_file):
    path = drafter_file(tmp_path / "d.gguf", **TOY)
    target = ToyTarget()
    attach_dflash(target, path)
    prompt = [1, 2, 3, 4, 5, 6, 7, 3, 4, 5]
    spec = make_block_speculator(target, OPTIONS)
    out = generate(target, prompt, OPTIONS, max_tokens=24, speculator=spec)
    plain = generate(ToyTarget(), prompt, SpeculationOptions(enabled=False), max_tokens=24)
    assert list(out.tokens) == list(plain.tokens) and out.stats.draft_tokens > 0


class FakeBlockHead:
    """A minimal third-party block head without ``for_sequence``."""

    kind = DraftHeadKind.BLOCK
    block_size = 4
    resumes_after_gap = True

    def __init__(self):
        self.resets = 0

    def draft_block(self, last_token, h_prev, position, max_tokens):
        return [int(last_token) % 30 + 1] * min(max_tokens, 3), [0.9] * min(max_tokens, 3)

    def draft_catch_up(self, tokens, h_rows, start_pos):
        pass

    def reset(self):
        self.resets += 1


def test_a_head_without_the_member_is_driven_directly():
    target = ToyTarget()
    fake = target.draft_head = FakeBlockHead()
    spec = make_block_speculator(target, OPTIONS)
    assert spec.head is fake and not spec.owns_head
    spec.close()
    assert fake.resets == 1  # as before views: the shared head is reset at close
