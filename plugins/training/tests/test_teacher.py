"""Teacher forcing (tsspec_training.teacher): the dense output matrix gives the labels and top-k
of the target's own LM head, so the fast path changes no training data."""

from __future__ import annotations

import torch

from tsspec.testing import ToyTarget
from tsspec_training.teacher import collect, output_matrix, teacher_pass


def test_output_matrix_is_the_lm_head():
    target = ToyTarget(vocab_size=40, hidden_size=12, recurrent=False)
    head = output_matrix(target)  # [V, H]
    assert head.shape == (40, 12) and head.dtype == torch.float32
    rows = torch.randn(5, 12, dtype=torch.float64)
    assert torch.allclose(rows.float() @ head.t(), target.lm_head(rows).float(), atol=1e-5)


def test_dense_head_pass_matches_the_targets_own_logits():
    target = ToyTarget(vocab_size=40, hidden_size=12, recurrent=False, seed=4)
    tokens = torch.randint(0, 40, (50,), generator=torch.Generator().manual_seed(0)).tolist()
    slow = teacher_pass(target, tokens, soft_k=4)
    fast = teacher_pass(target, tokens, soft_k=4, head=output_matrix(target))
    assert torch.equal(slow.labels, fast.labels)
    assert torch.equal(slow.topk_ids, fast.topk_ids)
    assert torch.equal(slow.hidden, fast.hidden)
    assert target.cache_seq_len == 0  # rewound for the next sequence


def test_collect_logs_its_rate_and_keeps_sources():
    target = ToyTarget(vocab_size=40, hidden_size=12, recurrent=False)
    lines = []
    data = collect(target, [("a", [1, 2, 3, 4]), ("b", [5, 6, 7])], soft_k=2, log=lines.append)
    assert [d.source for d in data] == ["a", "b"] and [len(d.labels) for d in data] == [4, 3]
    assert len(lines) == 1 and "7 tokens" in lines[0] and "tokens/s" in lines[0]
