"""Batched greedy answers (tsspec_training.answers): the same answers as one prompt at a time,
whatever the batch size and row budget; a target without a paged path gets None."""

from __future__ import annotations

import json

import torch

from tsspec.protocols import PagedRows
from tsspec.testing import ToyTarget
from tsspec_training.answers import batched_greedy
from tsspec_training.teacher import answer_prompts, greedy_answer


class _ToyPaged:
    """A paged KV over a ToyTarget: each sequence's rows are recomputed from its own tokens
    (kept per block table), so a row's logits never depend on the rest of the batch."""

    def __init__(self, target: ToyTarget, num_blocks: int, block_size: int, max_rows: int):
        self.target = target
        self.max_batch_rows = max_rows
        self.num_blocks, self.block_size = num_blocks, block_size
        self.history: dict[tuple, list[int]] = {}
        self.batches: list[int] = []  # rows per forward

    def forward(self, batch):
        assert sum(len(r.tokens) for r in batch) <= self.max_batch_rows
        assert all(0 <= b < self.num_blocks for r in batch for b in r.blocks)
        self.batches.append(sum(len(r.tokens) for r in batch))
        out = []
        for r in batch:
            assert isinstance(r, PagedRows)
            key = tuple(r.blocks)
            seen = self.history.get(key, []) if r.past else []
            assert len(seen) == r.past
            tokens = seen + list(r.tokens)
            self.history[key] = tokens
            self.target.spec_rewind_cache(0)
            logits, _ = self.target.spec_forward(tokens, all_logits_rows=False, want_hidden=False)
            self.target.spec_rewind_cache(0)
            out.append((logits, None))
        return out


class _PagedToy(ToyTarget):
    def __init__(self, max_rows: int = 12, **kw):
        super().__init__(recurrent=False, **kw)
        self.max_rows = max_rows
        self.opened: _ToyPaged | None = None

    def spec_open_paged(self, num_blocks: int, block_size: int):
        self.opened = _ToyPaged(self, num_blocks, block_size, self.max_rows)
        return self.opened


def _prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 32, (n,), generator=g).tolist() for n in (3, 17, 5, 9, 30, 1, 12)]


def test_batched_answers_equal_one_prompt_at_a_time():
    target = _PagedToy(vocab_size=32, max_rows=12, seed=1)
    prompts = _prompts()
    eos = frozenset({7})
    solo = []
    for p in prompts:
        answer = greedy_answer(target, p, 20)
        cut = next((i + 1 for i, t in enumerate(answer) if t in eos), len(answer))
        solo.append(answer[:cut])
    done = {}
    got = batched_greedy(target, prompts, 20, eos=eos, batch=4, on_done=lambda i, a: done.setdefault(i, a))
    assert got == solo
    assert done == dict(enumerate(solo))
    assert max(target.opened.batches) <= 12 and len(target.opened.batches) < sum(len(p) + 20 for p in prompts)


def test_a_target_without_a_paged_path_gets_none():
    target = ToyTarget(vocab_size=32, recurrent=False)
    assert batched_greedy(target, _prompts(), 8) is None


def test_answer_prompts_caches_and_batches(tmp_path):
    target = _PagedToy(vocab_size=32, max_rows=16, seed=2)
    cache = tmp_path / "answers.jsonl"
    texts = ["alpha beta", "gamma", "delta epsilon zeta"]
    first = answer_prompts(target, texts, cache, max_new_tokens=6, batch=3)
    assert [r["prompt"] for r in first] == texts and target.opened is not None
    for rec in first:
        assert rec["answer_ids"] == greedy_answer(target, rec["prompt_ids"], 6)
    lines = [json.loads(x) for x in cache.read_text().splitlines()]
    assert sorted(r["prompt"] for r in lines) == sorted(texts)
    target.opened = None
    again = answer_prompts(target, texts, cache, max_new_tokens=6, batch=3)
    assert again == first and target.opened is None  # all cached: nothing answered
