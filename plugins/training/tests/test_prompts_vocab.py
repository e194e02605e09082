"""Prompt generation with its held-out split, and the FR-Spec draft vocabulary."""

from __future__ import annotations

import torch

from tsspec_training import prompts, vocab


def test_prompts_are_seeded_and_the_split_is_disjoint():
    assert prompts.all_prompts(120, seed=3) == prompts.all_prompts(120, seed=3)
    train = set(prompts.training_prompts(300))
    held = set(prompts.held_out_prompts(300))
    assert train and held and not train & held
    assert all(prompts.is_held_out(p) for p in held)


def test_draft_vocabulary_keeps_the_most_frequent_labels_and_forced_ids():
    labels = [torch.tensor([5, 5, 5, 2, 2, 9, 1]), torch.tensor([2, 7])]
    ids = vocab.draft_vocabulary(labels, 10, 3, always=[0])
    assert ids.tolist() == [0, 2, 5]  # 0 forced; then 5 (3x), 2 (3x: ties to the lower id first)
    assert abs(vocab.coverage(labels, ids) - 6 / 9) < 1e-9
    assert vocab.to_draft_labels(torch.tensor([5, 9, 0]), ids, 10).tolist() == [2, -100, 0]


def test_a_large_prompt_set_mixes_shapes_and_keeps_the_split():
    many = prompts.all_prompts(400, seed=0)  # large enough for every shape
    assert len(many) == len(set(many)) == 400
    assert any("```python" in p for p in many)  # code edits over standard-library functions
    assert any("\n\n" in p and "```" not in p for p in many)  # instructions over stdlib docstrings
    assert any(p.startswith(("Hi!", "Thanks for", "My friend", "I have an exam", "Can you explain")) for p in many)
    assert any("boxes" in p or "rectangle" in p or "average of" in p for p in many)  # word problems
    held = [p for p in many if prompts.is_held_out(p)]
    assert 0 < len(held) < 80  # about HELD_OUT_SHARE of them


def test_mixed_counts_weigh_each_group_by_its_share_of_the_batches():
    answers = [torch.tensor([3, 3, 3, 3])]  # a small group drawn half the time
    corpus = [torch.tensor([1] * 100 + [2] * 90)]
    assert vocab.draft_vocabulary(answers + corpus, 10, 2).tolist() == [1, 2]  # raw counts: the corpus's
    counts = vocab.mixed_counts([(answers, 0.5), (corpus, 0.5)], 10)
    assert abs(float(counts.sum()) - 1.0) < 1e-12 and abs(float(counts[3]) - 0.5) < 1e-12
    assert vocab.top_ids(counts, 2).tolist() == [1, 3]
    assert vocab.top_ids(counts, 2, always=[9]).tolist() == [3, 9]
    assert vocab.top_ids(vocab.mixed_counts([(answers, 0.0), (corpus, 1.0)], 10), 2).tolist() == [1, 2]
