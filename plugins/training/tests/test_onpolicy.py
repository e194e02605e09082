"""On-policy data (tsspec_training.onpolicy): the prompt mix keeps out held-out and benchmark
prompts and covers every class; batched greedy and sampled answers equal one prompt at a time;
the cache is extended, never redone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tsspec_training import onpolicy, prompts
from tsspec_training.onpolicy import _one_answer, mode_sampler, onpolicy_answers, prompt_mix, read_cache

sys.path.insert(0, str(Path(__file__).parent))
from test_answers import _PagedToy  # noqa: E402


def test_the_mix_covers_every_class_and_keeps_out_held_out_and_benchmark_prompts():
    mix = prompt_mix(400, seed=0)
    assert len(mix) == 400 and mix == prompt_mix(400, seed=0) and prompt_mix(40, seed=0) == mix[:40]
    assert {r["class"] for r in mix} == {"chat", "explanation", "prose", "math", "code"}
    bench = prompts._bench_texts()
    assert bench  # the benchmark's turns are read, so the check below can fail
    assert not any(prompts.is_held_out(r["prompt"]) or r["prompt"] in bench for r in mix)
    assert len({(r["system"], r["prompt"]) for r in mix}) == 400


def test_a_bad_mode_is_refused():
    with pytest.raises(ValueError, match="greedy or sample-SEED"):
        mode_sampler("hot")


def _mix(n):
    return [{"class": "given", "system": "", "prompt": f"p{i}", "prompt_ids": [(3 * i + j) % 32 for j in range(2 + i % 5)]}
            for i in range(n)]


def test_batched_answers_equal_one_at_a_time_greedy_and_sampled_and_the_cache_extends(tmp_path):
    target = _PagedToy(vocab_size=32, max_rows=16, seed=2)
    first = onpolicy_answers(target, _mix(5), tmp_path, modes=("greedy", "sample-1"), max_new_tokens=8, batch=4)
    assert len(first) == 10 and target.opened is not None
    for rec in first:
        sampler = mode_sampler(rec["mode"], rec["system"] + "\x00" + rec["prompt"])
        answer, _, argmax = _one_answer(target, rec["prompt_ids"], 8, frozenset(),
                                        lambda i, logits, pos, prev: sampler.sample(logits, pos, prev), False)
        assert rec["answer_ids"] == answer
    sampled = {r["prompt"]: r["answer_ids"] for r in first if r["mode"] == "sample-1"}
    greedy = {r["prompt"]: r["answer_ids"] for r in first if r["mode"] == "greedy"}
    assert sampled != greedy
    target.opened = None
    again = onpolicy_answers(target, _mix(5), tmp_path, modes=("greedy", "sample-1"), max_new_tokens=8, batch=4)
    assert again == first and target.opened is None  # all cached: nothing answered
    more = onpolicy_answers(target, _mix(7), tmp_path, modes=("greedy", "sample-1"), max_new_tokens=8, batch=4)
    assert more[:10] == first and len(more) == 14
    assert len(read_cache(tmp_path / "answers.jsonl")) == 14  # only the 4 new answers were added


def test_feature_layers_are_low_middle_high():
    assert onpolicy.feature_layers(30) == (2, 15, 30)
    assert onpolicy.feature_layers(2) == (0, 1, 2)
