"""The NextN head against a float64 reference written from its equations (transformers does not
build the NextN layer)::

    u = eh_proj([enorm(E x) ; hnorm(h_prev)]);  u' = GLM decoder layer(u) at p (dense attention);
    out = shared_head_norm(u') (chained);  logits = lm_head(out)

built from transformers' own GLM decoder layer, kept in float64 (``float64_oracle``); and the
head's own contracts: the folded catch-up equals catch-up then step, rollback by position."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

TOL64, TOL32 = 1e-9, 1e-4


class NextNReference:
    def __init__(self, oracle):
        from transformers.cache_utils import DynamicCache

        self.mods = copy.deepcopy(oracle.nextn).double()
        self.embed = oracle.model.model.embed_tokens.weight.detach().double()
        self.head = oracle.model.lm_head.weight.detach().double()
        self.rotary = copy.deepcopy(oracle.model.model.rotary_emb).double()
        self.cache = DynamicCache(config=oracle.nextn_config)


def _reference(oracle):
    ref = NextNReference(oracle)

    @torch.no_grad()
    def step(token, h_prev, pos, float64_oracle):
        m = ref.mods
        with float64_oracle():
            u = m["eh_proj"](torch.cat([m["enorm"](ref.embed[token][None]), m["hnorm"](h_prev.double()[None])], -1))
            u = u[None]  # [1, 1, H]
            position_ids = torch.tensor([[pos]])
            pe = ref.rotary(u, position_ids=position_ids)
            mask = torch.zeros(1, 1, 1, ref.cache.get_seq_length() + 1, dtype=torch.float64)
            out, _ = m["layer"](u, attention_mask=mask, position_ids=position_ids, cache=ref.cache,
                                use_cache=True, position_embeddings=pe)
            out = m["head_norm"](out)[0, 0]
        return F.linear(out, ref.head), out

    return step


@pytest.fixture(scope="module")
def trunk_rows(make_target, sequence):
    """(target, rows [24, H]): row p is the trunk row that PREDICTED token p (position p-1;
    zeros for position 0), as the loop commits them."""
    target = make_target(dtype="float64", with_nextn=True)
    _, hidden = target.spec_forward(sequence[:24], all_logits_rows=True, want_hidden=True)
    return target, torch.cat([torch.zeros_like(hidden[:1]), hidden[:-1]])


@pytest.mark.oracle
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_catch_up_and_chained_steps_match_the_reference(oracle, make_target, sequence, trunk_rows,
                                                         float64_oracle_context, rel_err, dtype):
    """Catch up on positions 1..15 from the trunk's rows, then 5 chained draft steps."""
    _, hidden = trunk_rows
    head = make_target(dtype=dtype, with_nextn=True).draft_head
    tol = TOL64 if dtype == "float64" else TOL32
    ref = _reference(oracle)
    want = [ref(sequence[p], hidden[p], p, float64_oracle_context) for p in range(1, 16)]
    head.draft_catch_up(sequence[:15], hidden[:15].to(head.trunk.dtype), 0)  # positions 1..14
    logits, out = head.draft_step(sequence[15], hidden[15].to(head.trunk.dtype), 15)
    assert rel_err(logits, want[14][0]) < tol and rel_err(out, want[14][1]) < tol
    token, h = int(logits.argmax()), out
    chained_h = want[14][1]
    for p in range(16, 21):
        logits, h = head.draft_step(token, h, p)
        ref_logits, chained_h = ref(token, chained_h, p, float64_oracle_context)
        assert rel_err(logits, ref_logits) < tol, f"position {p}"
        token = int(ref_logits.argmax())


def test_folded_catch_up_equals_catch_up_then_step(make_target, sequence, trunk_rows):
    _, hidden = trunk_rows
    a = make_target(dtype="float64", with_nextn=True).draft_head
    b = make_target(dtype="float64", with_nextn=True).draft_head
    a.draft_catch_up(sequence[:10], hidden[:10], 0)
    la, ha = a.draft_step(sequence[10], hidden[10], 10)
    lb, hb = b.draft_catch_up_and_step(sequence[:11], hidden[:11], 0)
    assert float((la - lb).abs().max()) < 1e-12 and float((ha - hb).abs().max()) < 1e-12


def test_rollback_by_position(make_target, sequence, trunk_rows):
    """Drafting past a rejection then catching up from the accepted position gives what a head
    that never drafted gives."""
    _, hidden = trunk_rows
    a = make_target(dtype="float64", with_nextn=True).draft_head
    b = make_target(dtype="float64", with_nextn=True).draft_head
    a.draft_catch_up(sequence[:12], hidden[:12], 0)
    logits, h = a.draft_step(sequence[12], hidden[12], 12)
    for p in range(13, 16):  # drafts that will be rejected
        logits, h = a.draft_step(int(logits.argmax()), h, p)
    la, _ = a.draft_catch_up_and_step(sequence[12:16], hidden[12:16], 12)
    lb, _ = b.draft_catch_up_and_step(sequence[:16], hidden[:16], 0)
    assert float((la - lb).abs().max()) < 1e-12


def test_sequence_views_do_not_share_state(make_target, sequence, trunk_rows):
    _, hidden = trunk_rows
    head = make_target(dtype="float64", with_nextn=True).draft_head
    one, two = head.for_sequence(), head.for_sequence()
    l1, _ = one.draft_catch_up_and_step(sequence[:8], hidden[:8], 0)
    two.draft_catch_up_and_step(sequence[8:16], hidden[8:16], 8)
    again, _ = head.for_sequence().draft_catch_up_and_step(sequence[:8], hidden[:8], 0)
    assert torch.equal(l1, again)
    assert head.counts.rows >= 7 + 8 + 7
