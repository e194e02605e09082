"""The NextN / MTP head: against HF's ``MtpLayer`` (built from the same decoder-layer classes),
the fused catch-up-and-step against catch-up + step, and its cache bookkeeping."""

from __future__ import annotations

import pytest
import torch

from tsspec.protocols import DraftHead, DraftHeadKind

ARCHS = ("qwen35", "qwen35moe", "qwen3next")
TOL = 1e-4


def _trunk_rows(target, ids):
    """The trunk's post-norm hidden rows for ``ids`` (a prefill on a fresh cache)."""
    target.spec_rewind_cache(0)
    _, hidden = target.spec_forward(ids, all_logits_rows=False, want_hidden=True)
    target.spec_keep(len(ids))
    return hidden


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_mtp_matches_hf_step_by_step_and_fused(arch, rel_err, oracle, make_target, sequence):
    ids = sequence[:24]
    ref_logits, ref_h = oracle(arch).mtp_rows(ids)  # row i: token i+1 with trunk row i
    target = make_target(arch, from_file=True)
    head = target.draft_head
    assert head is not None and isinstance(head, DraftHead)
    h = _trunk_rows(target, ids)
    # one fused call over every row, from position 0 (whose zero row the head skips)
    rows = torch.cat([torch.zeros(1, h.shape[1]), h[:-1]])
    logits, h_out = head.draft_catch_up_and_step(ids, rows, 0)
    assert rel_err(logits, ref_logits[-1]) < TOL
    assert rel_err(h_out, ref_h[-1]) < TOL
    # the same sequence one draft_step at a time
    head.reset()
    for i in range(1, len(ids)):
        logits, h_out = head.draft_step(ids[i], h[i - 1], i)
        assert rel_err(logits, ref_logits[i - 1]) < TOL, f"position {i}"
        assert rel_err(h_out, ref_h[i - 1]) < TOL


def test_fused_equals_catch_up_then_step(make_target, sequence):
    target = make_target("qwen35", dtype="float64")
    head = target.draft_head
    ids = sequence[:16]
    h = _trunk_rows(target, ids)
    rows = torch.cat([torch.zeros(1, h.shape[1], dtype=h.dtype), h[:-1]])
    fused = head.draft_catch_up_and_step(ids, rows, 0)
    head.reset()
    head.draft_catch_up(ids[:-1], rows[:-1], 0)
    calls = head.counts.calls
    stepped = head.draft_step(ids[-1], rows[-1], len(ids) - 1)
    assert head.counts.calls == calls + 1
    for a, b in zip(fused, stepped):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_catch_up_drops_rejected_drafts(make_target, sequence):
    """Chained draft steps write speculative rows; a catch-up from an earlier position must make
    the head exactly as if they never happened."""
    target = make_target("qwen35", dtype="float64")
    head = target.draft_head
    ids = sequence[:12]
    h = _trunk_rows(target, ids)
    rows = torch.cat([torch.zeros(1, h.shape[1], dtype=h.dtype), h[:-1]])
    head.draft_catch_up(ids[:10], rows[:10], 0)
    logits, h_out = head.draft_step(ids[10], rows[10], 10)
    for pos in (11, 12, 13):  # wrong drafts chained on the head's own output
        logits, h_out = head.draft_step(int(logits.argmax()), h_out, pos)
    assert head.end == 14
    after = head.draft_catch_up_and_step(ids[10:12], rows[10:12], 10)
    head.reset()
    fresh = head.draft_catch_up_and_step(ids, rows, 0)
    for a, b in zip(after, fresh):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_gap_restarts_and_shape_errors(make_target, sequence):
    target = make_target("qwen35")
    head = target.draft_head
    assert head.kind is DraftHeadKind.PER_TOKEN and head.block_size == 1 and head.resumes_after_gap is False
    h = torch.randn(4, target.config.hidden_size)
    head.draft_catch_up(sequence[:4], h, 0)
    assert (head.base, head.end) == (1, 4)
    head.draft_catch_up(sequence[10:12], h[:2], 10)  # a gap: positions 4..9 were never seen
    assert (head.base, head.end) == (10, 12)
    with pytest.raises(ValueError, match="feature taps"):
        head.draft_step(sequence[0], torch.randn(2 * target.config.hidden_size), 12)
    with pytest.raises(NotImplementedError):
        head.draft_block(sequence[0], h[0], 12, 3)


def test_no_draft_head_without_nextn_tensors(converted):
    from tsspec_model_qwen35.loader import load_from_source
    from tsspec_model_qwen35.source import MemorySource

    arch, meta, tensors = converted("qwen35", with_mtp=False)
    assert f"{arch}.nextn_predict_layers" not in meta
    target = load_from_source(MemorySource(arch, meta, tensors))
    assert target.draft_head is None
    assert target.hp.num_layers == 4 and target.hp.nextn_layers == 0
