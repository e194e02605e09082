"""The batched paged path: sequences sharing a ragged forward each get their solo rows bit for bit."""

from __future__ import annotations

import pytest
import torch

from tsspec.protocols import BatchedSpeculativeTarget, PagedKV, PagedRows

BLOCK = 4


def _paged(tiny, blocks=64):
    from gguf import GGMLQuantizationType as T

    from tsspec_gguf import native

    if not native.available():
        pytest.skip("the block kernels were not built")
    _, target, path = tiny(quantize={"*": T.Q8_0})
    return target, target.spec_open_paged(blocks, BLOCK), path


def _solo(path, prompt, steps, verify_at=None, drafts=()):
    """Per-step logits of one sequence alone on the linear cache: the prompt's last row, then
    greedy decode rows; at step ``verify_at`` a verify of [last, *drafts] (all rows)."""
    from tsspec_model_llama import load_llama

    target = load_llama(path)
    logits, _ = target.spec_forward(prompt, all_logits_rows=False, want_hidden=False)
    out = [logits]
    last = int(logits[-1].argmax())
    for step in range(steps):
        if step == verify_at:
            rows, _ = target.spec_forward([last, *drafts], all_logits_rows=True, want_hidden=False)
            target.spec_rewind_cache(target.cache_seq_len - len(drafts))  # keep `last` only
            out.append(rows)
            last = int(rows[0].argmax())
            continue
        logits, _ = target.spec_forward([last], all_logits_rows=False, want_hidden=False)
        out.append(logits)
        last = int(logits[-1].argmax())
    return out


@pytest.mark.parametrize("layout", ["interleaved", "consecutive", "mixed"])
def test_ragged_batch_rows_equal_each_sequence_alone(tiny, layout):
    target, kv, path = _paged(tiny)
    assert isinstance(target, BatchedSpeculativeTarget) and isinstance(kv, PagedKV)
    prompts = [[5, 9, 33, 2, 7, 100, 12], [250, 3, 3, 3], [17] * 11, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    steps, verify_seq, verify_at, drafts = 5, 2, 2, (8, 44, 9)
    expected = [
        _solo(path, p, steps, verify_at if i == verify_seq else None, drafts) for i, p in enumerate(prompts)
    ]
    # interleaved: no sequence's blocks are consecutive (its keys are gathered); consecutive:
    # every sequence's are (the kernel reads them in the pool); mixed: sequences 0 and 2 so
    free = list(range(kv.num_blocks))
    interleaved = [[free[j * len(prompts) + i] for j in range(8)] for i in range(len(prompts))]
    consecutive = [[32 + 8 * i + j for j in range(8)] for i in range(len(prompts))]
    tables = {"interleaved": interleaved, "consecutive": consecutive,
              "mixed": [consecutive[i] if i % 2 == 0 else interleaved[i] for i in range(len(prompts))]}[layout]
    lengths = [0] * len(prompts)
    # prefill: sequence 0 alone, the others together (the grouping must not matter)
    got = [[] for _ in prompts]
    for group in ([0], [1, 2, 3]):
        batch = [PagedRows(tables[i], 0, prompts[i]) for i in group]
        for i, (logits, hidden) in zip(group, kv.forward(batch)):
            assert hidden is None and logits.shape == (1, 300)
            got[i].append(logits)
            lengths[i] = len(prompts[i])
    lasts = [int(g[0][-1].argmax()) for g in got]
    for step in range(steps):
        batch, order = [], []
        for i in range(len(prompts)):
            if i == 1 and step == 3:
                continue  # a sequence may sit a step out
            if i == verify_seq and step == verify_at:
                batch.append(PagedRows(tables[i], lengths[i], [lasts[i], *drafts], all_logits=True))
            else:
                batch.append(PagedRows(tables[i], lengths[i], [lasts[i]]))
            order.append(i)
        for i, (logits, _) in zip(order, kv.forward(batch)):
            got[i].append(logits)
            lengths[i] += 1  # a verify keeps `last` only (the rest is overwritten later)
            lasts[i] = int(logits[0].argmax())
        if step == 3:  # sequence 1 catches up alone
            (logits, _), = kv.forward([PagedRows(tables[1], lengths[1], [lasts[1]])])
            got[1].append(logits)
            lengths[1] += 1
            lasts[1] = int(logits[0].argmax())
    for i in range(len(prompts)):
        assert len(got[i]) == len(expected[i])
        for a, b in zip(got[i], expected[i]):
            assert torch.equal(a, b), f"sequence {i} differs from its solo run"


def test_hidden_rows_taps_and_block_copy(tiny):
    target, kv, path = _paged(tiny)
    from tsspec_model_llama import load_llama

    solo = load_llama(path)
    prompt = [4, 8, 15, 16, 23, 42]
    expected_logits, expected_hidden = solo.spec_forward(prompt, all_logits_rows=True, want_hidden=True)
    (logits, hidden), = kv.forward([PagedRows([3, 7], 0, prompt, all_logits=True, want_hidden=True)])
    assert torch.equal(logits, expected_logits) and torch.equal(hidden, expected_hidden)
    # a copied block serves a sequence that continues from it
    kv.copy_block(3, 9)
    kv.copy_block(7, 10)
    (row, _), = kv.forward([PagedRows([9, 10], 6, [77])])
    solo_row, _ = solo.spec_forward([77], all_logits_rows=False, want_hidden=False)
    assert torch.equal(row, solo_row)
    target.spec_set_feature_taps([0, 2])
    solo.spec_set_feature_taps([0, 2])
    solo.spec_rewind_cache(0)
    _, tap_expected = solo.spec_forward(prompt, all_logits_rows=False, want_hidden=True)
    (_, taps), = kv.forward([PagedRows([1, 2], 0, prompt, want_hidden=True)])
    assert taps.shape == (6, 128) and torch.equal(taps, tap_expected)


def test_paged_errors(tiny):
    target, kv, _ = _paged(tiny, blocks=4)
    with pytest.raises(ValueError, match="at most"):
        kv.forward([PagedRows([0, 1, 2, 3], 0, [1] * (kv.max_batch_rows + 1))])
    with pytest.raises(ValueError, match="blocks hold"):
        kv.forward([PagedRows([0], 0, [1] * (BLOCK + 1))])
    with pytest.raises(ValueError, match="token ids"):
        kv.forward([PagedRows([0], 0, [300])])
    assert target.spec_kv_bytes_per_block(BLOCK) == 2 * 2 * 2 * BLOCK * 16 * 4
    from tsspec_model_llama import load_llama

    dense = load_llama(_paged(tiny)[2], {"dtype": "float32"})
    with pytest.raises(ValueError, match="block-kernel path"):
        dense.spec_open_paged(4, BLOCK)


@pytest.mark.parametrize("want_hidden", [False, True])
def test_a_lone_sequence_on_consecutive_blocks_takes_one_native_call(tiny, monkeypatch, want_hidden):
    target, kv, path = _paged(tiny)
    _, twin, _ = _paged(tiny)  # the per-op path, for comparison
    monkeypatch.setattr(twin, "_one_call", lambda r, first: None)
    calls = []
    one_call = kv._one_call
    monkeypatch.setattr(kv, "_one_call", lambda r, first: calls.append(first) or one_call(r, first))
    prompt, blocks = [4, 8, 15, 16, 23, 42, 7], [5, 6, 7, 8]
    steps = [PagedRows(blocks, 0, prompt, want_hidden=want_hidden),
             PagedRows(blocks, 7, [9, 31, 2], all_logits=True, want_hidden=want_hidden),  # a verify
             PagedRows(blocks, 8, [11], want_hidden=want_hidden)]  # after keeping one row of it
    for rows in steps:
        (logits, hidden), = kv.forward([rows])
        (expected, expected_hidden), = twin.forward([rows])
        assert torch.equal(logits, expected)
        assert (hidden is None) == (not want_hidden) and (hidden is None or torch.equal(hidden, expected_hidden))
    assert calls == [5 * BLOCK] * 3 or target._step_head is None
    if target._step_head is not None:
        assert kv._one_call(steps[-1], 5 * BLOCK) is not None  # really the native call, not a decline
    # blocks that are not consecutive take the per-op path
    calls.clear()
    kv.forward([PagedRows([1, 3], 0, prompt)])
    assert calls == []
