"""Held-out teacher data (tsspec.training.dataset.build_held_out): each prompt + answer sequence
knows where its answer starts, freshly built and read back from the cache alike."""

from __future__ import annotations

import torch

from tsspec.testing import ToyTarget
from tsspec.training import prompts
from tsspec.training.dataset import DataSpec, build_held_out


def test_held_out_sequences_know_where_the_answer_starts(tmp_path):
    target = ToyTarget(vocab_size=32, hidden_size=12, recurrent=False)
    spec = DataSpec(seq_len=200, answer_tokens=5, cache_dir=str(tmp_path))
    fresh = build_held_out(target, "toy-id", spec, 3, log=lambda _: None)
    chosen = prompts.held_out_prompts(36, spec.seed)[:3]
    tok = target.tokenizer
    lengths = [len(tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))) for p in chosen]
    assert [s.answer_start for s in fresh] == lengths
    assert all(len(s.tokens) == start + 5 for s, start in zip(fresh, lengths))  # 5 answer tokens each
    cached = build_held_out(target, "toy-id", spec, 3, log=lambda _: None)
    assert [s.answer_start for s in cached] == lengths
    assert all(torch.equal(a.labels, b.labels) for a, b in zip(fresh, cached))


def test_a_held_out_cache_written_before_answer_starts_still_loads(tmp_path):
    target = ToyTarget(vocab_size=32, hidden_size=12, recurrent=False)
    spec = DataSpec(seq_len=200, answer_tokens=5, cache_dir=str(tmp_path))
    fresh = build_held_out(target, "toy-id", spec, 2, log=lambda _: None)
    (path,) = tmp_path.rglob("held-out-*.pt")
    saved = torch.load(path, weights_only=False)
    for seq in saved["sequences"]:
        del seq["answer_start"]  # as the sequences were saved before they carried it
    torch.save(saved, path)
    cached = build_held_out(target, "toy-id", spec, 2, log=lambda _: None)
    assert [s.answer_start for s in cached] == [s.answer_start for s in fresh] and fresh[0].answer_start > 0
