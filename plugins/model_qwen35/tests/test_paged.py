"""The hybrid's paged KV: sequences in one ragged batch each equal their solo linear-path run
(logits bit for bit), verify + partial keep on both rollback paths, release frees the
recurrent slot, and a sequence cannot resume at a prefix it has no state for."""

from __future__ import annotations

import pytest
import torch

from tsspec.protocols import BatchedSpeculativeTarget, PagedKV, PagedRows

BLOCK = 4


class _Seq:
    """One sequence's block table in a test (blocks handed out in order, never shared)."""

    next_block = 0

    def __init__(self, seq: int):
        self.seq, self.blocks, self.len = seq, [], 0

    def rows(self, tokens, *, verify=False, want_hidden=False) -> PagedRows:
        end = self.len + len(tokens)
        while len(self.blocks) * BLOCK < end:
            self.blocks.append(_Seq.next_block)
            _Seq.next_block += 1
        return PagedRows(list(self.blocks), self.len, list(tokens), verify, want_hidden, seq=self.seq)


def _script(sequence):
    """Per sequence: a prompt, then steps ('plain', token) / ('verify', tokens, rows_kept)."""
    return [
        (sequence[:9], [("plain", 5), ("verify", [7, 8, 9, 10], 2), ("plain", 11), ("verify", [1, 2, 3], 3),
                        ("verify", list(range(40, 57)), 5), ("plain", 70)]),  # 17 rows: wider than the slots
        (sequence[20:23], [("verify", [4, 4, 4, 4, 4], 1), ("plain", 6), ("plain", 60)]),
        (sequence[30:47], [("plain", 3), ("plain", 90), ("verify", [15, 16], 1), ("plain", 2)]),
    ]


def _solo(target, prompt, steps):
    out = [target.spec_forward(prompt, all_logits_rows=False, want_hidden=True)]
    target.spec_keep(len(prompt))
    for step in steps:
        if step[0] == "plain":
            out.append(target.spec_forward([step[1]], all_logits_rows=False, want_hidden=True))
            target.spec_keep(1)
        else:
            out.append(target.spec_forward(step[1], all_logits_rows=True, want_hidden=True))
            target.spec_keep(step[2])
    return out


@pytest.mark.parametrize("per_row", [True, False], ids=["snapshots", "restore"])
def test_batched_sequences_equal_their_solo_runs(make_target, sequence, per_row):
    script = _script(sequence)
    expected = [_solo(make_target(per_row_snapshots=per_row), p, steps) for p, steps in script]
    target = make_target(per_row_snapshots=per_row)
    assert isinstance(target, BatchedSpeculativeTarget)
    kv = target.spec_open_paged(64, BLOCK)
    assert isinstance(kv, PagedKV) and kv.num_blocks == 64
    seqs = [_Seq(10 + i) for i in range(len(script))]
    got = [[] for _ in script]
    # step t of every sequence runs in one batch (the prompt is step 0)
    for t in range(max(len(steps) for _, steps in script) + 1):
        batch, owners, keeps = [], [], []
        for i, (prompt, steps) in enumerate(script):
            if t == 0:
                batch.append(seqs[i].rows(prompt, want_hidden=True))
                keeps.append(len(prompt))
            elif t - 1 < len(steps):
                step = steps[t - 1]
                tokens = [step[1]] if step[0] == "plain" else step[1]
                batch.append(seqs[i].rows(tokens, verify=step[0] == "verify", want_hidden=True))
                keeps.append(step[2] if step[0] == "verify" else None)
            else:
                continue
            owners.append(i)
        for i, rows, keep, out in zip(owners, batch, keeps, kv.forward(batch)):
            got[i].append(out)
            if rows.all_logits:
                mode = kv.keep(rows.seq, keep)
                assert mode in ("committed", "all", "reforward")
                seqs[i].len += keep
            else:
                seqs[i].len += len(rows.tokens)
    for i in range(len(script)):
        assert len(got[i]) == len(expected[i])
        for (gl, gh), (el, eh) in zip(got[i], expected[i]):
            assert torch.equal(gl, el), f"sequence {i}: logits differ from its solo run"
            assert torch.equal(gh, eh), f"sequence {i}: hidden rows differ from its solo run"
    assert target.counters.state_restores >= 1  # a partly kept wide (or restore-path) verify re-forwarded
    assert kv.live_sequences == 3
    for s in seqs:
        kv.release(s.seq)
    assert kv.live_sequences == 0


def test_a_sequence_without_state_cannot_start_past_zero(make_target):
    target = make_target()
    kv = target.spec_open_paged(8, BLOCK)
    assert not kv.resumes_prefix and kv.prefix_refusal
    with pytest.raises(ValueError, match="no recurrent state at position 4"):
        kv.forward([PagedRows([0, 1], 4, [3], seq=1)])
    with pytest.raises(ValueError, match="no verify"):
        kv.keep(1, 1)


def test_bytes_per_block_count_attention_layers_only(make_target):
    target = make_target()
    hp = target.hp
    attn = sum(1 for r in hp.recurrent if not r)
    assert target.spec_kv_bytes_per_block(16) == 2 * attn * hp.num_kv_heads * 16 * hp.head_dim * 4
