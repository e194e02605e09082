"""Teacher data sets (tsspec_training.dataset): held-out sequences know where their answer
starts, freshly built and read back from the cache alike; further prompts (``more_prompts``)
extend the first set and are cached apart, leaving the base data's cache and key as they were."""

from __future__ import annotations

import hashlib
import json

import attrs
import torch

from tsspec.testing import ToyTarget
from tsspec_training import corpus, dataset, prompts
from tsspec_training.dataset import CHAT_SOURCE, DataSpec, build, build_held_out, more_prompts


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


def _small_pool(monkeypatch, size=60):
    monkeypatch.setattr(prompts, "training_prompts", lambda count, seed=0: [f"prompt {i}" for i in range(min(count, size))])


def test_more_prompts_follow_the_first_set_and_a_smaller_count_is_a_prefix(monkeypatch):
    _small_pool(monkeypatch)
    ten = more_prompts(DataSpec(prompts=5, more_prompts=10))
    assert ten == [f"prompt {i}" for i in range(5, 15)]
    assert more_prompts(DataSpec(prompts=5, more_prompts=4)) == ten[:4]
    assert len(more_prompts(DataSpec(prompts=5, more_prompts=100))) == 55  # the pool runs out


def test_the_data_key_is_unchanged_without_more_prompts():
    spec = DataSpec(prompts=7)
    assert spec.key("id") == attrs.evolve(spec, more_prompts=0).key("id")
    assert spec.key("id") != attrs.evolve(spec, more_prompts=3).key("id")
    fields = attrs.asdict(spec)
    for name in ("cache_dir", "sequences", "more_prompts"):
        fields.pop(name)  # the key corpus-built data had before more_prompts existed
    text = json.dumps({"target": "id", **fields}, sort_keys=True, default=list)
    assert spec.key("id") == hashlib.sha256(text.encode()).hexdigest()[:16]


def test_more_answers_are_cached_apart_and_counted_in_the_manifest(tmp_path, monkeypatch):
    _small_pool(monkeypatch)
    target = ToyTarget(vocab_size=32, hidden_size=12, recurrent=False)
    info = corpus.SourceInfo(CHAT_SOURCE, "base answers", "toy", documents=1, characters=4)
    monkeypatch.setattr(dataset, "_corpus_sequences",
                        lambda *a: ([(CHAT_SOURCE, [1, 2, 3, 4, 5])], {CHAT_SOURCE: info}))
    base_spec = DataSpec(seq_len=200, answer_tokens=4, prompts=2, cache_dir=str(tmp_path))
    base, base_manifest = build(target, "toy-id", base_spec, log=lambda _: None)
    spec = attrs.evolve(base_spec, more_prompts=3)
    data, manifest = build(target, "toy-id", spec, log=lambda _: None)
    assert len(base) == 1 and len(data) == 4 and torch.equal(data[0].labels, base[0].labels)
    assert all(s.source == CHAT_SOURCE for s in data)
    (entry,) = manifest["sources"]
    assert entry["documents"] == 4 and entry["tokens"] == sum(len(s.tokens) for s in data)
    assert manifest["tokens"] == entry["tokens"] and manifest["sequences"] == 4
    assert base_manifest["sources"][0]["documents"] == 1  # the base data's cache is untouched
    assert (tmp_path / f"teacher-{base_spec.key('toy-id')}.pt").exists()
    assert (tmp_path / f"teacher-more-{spec.key('toy-id')}.pt").exists()
    again, _ = build(target, "toy-id", spec, log=lambda _: None)  # read back from the caches
    assert all(torch.equal(a.labels, b.labels) for a, b in zip(data, again))
