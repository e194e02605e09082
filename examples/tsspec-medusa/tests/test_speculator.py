"""MedusaSpeculator.propose and the factory's declines."""

from __future__ import annotations

import math

import pytest
import torch

import tsspec
from tsspec import DraftContext, SpeculatorDeclined, TsspecError
from tsspec.testing import ToyTarget, plugin_catalog
from tsspec_medusa import (
    NO_FILE_REASON,
    MedusaHeads,
    MedusaSpeculator,
    attach_medusa,
    make_medusa,
    write_random_medusa,
)

H, V = 4, 10


def one_hot_heads(tokens: list[int], margins: list[float]) -> MedusaHeads:
    """Heads whose logits on the all-ones row put ``margins[k]`` on ``tokens[k]``, 0 elsewhere."""
    k = len(tokens)
    out = torch.zeros(k, V, H)
    for i, (tok, margin) in enumerate(zip(tokens, margins)):
        out[i, tok] = margin / H  # logit = margin on a row of ones
    return MedusaHeads(torch.zeros(k, 1, H, H), torch.zeros(k, 1, H), out)


def top1_prob(margin: float) -> float:
    return math.exp(margin) / (math.exp(margin) + V - 1)


def ctx(max_tokens=8, hidden=torch.ones(H), history=(1, 2, 3), adjust=None):
    return DraftContext(
        last_token=history[-1], position=len(history) - 1, max_tokens=max_tokens, history=history,
        carry_hidden=hidden, adjust_logits=adjust, vocab_size=V,
    )


def test_head_k_gives_the_k_plus_first_draft():
    spec = MedusaSpeculator(one_hot_heads([7, 3, 5], [5.0, 5.0, 5.0]))
    assert spec.max_draft_tokens == 3
    assert spec.propose(ctx()) == [7, 3, 5]


def test_the_chain_respects_max_tokens_and_the_window():
    spec = MedusaSpeculator(one_hot_heads([7, 3, 5], [5.0] * 3))
    assert spec.propose(ctx(max_tokens=2)) == [7, 3]
    assert MedusaSpeculator(one_hot_heads([7, 3, 5], [5.0] * 3), max_draft_tokens=1).propose(ctx()) == [7]
    assert MedusaSpeculator(one_hot_heads([7], [5.0]), max_draft_tokens=8).max_draft_tokens == 1


def test_no_row_no_draft():
    spec = MedusaSpeculator(one_hot_heads([7], [5.0]))
    assert spec.propose(ctx(hidden=None)) == []
    assert spec.propose(ctx(max_tokens=0)) == []
    spec.close()
    assert spec.propose(ctx()) == []


def test_the_gate_is_on_the_chain_survival_product():
    margins = [4.0, 4.0, 1.0]
    p = [top1_prob(m) for m in margins]
    heads = one_hot_heads([7, 3, 5], margins)
    # between p0*p1 and p0: the second head drops the survival below the gate
    gate = (p[0] + p[0] * p[1]) / 2
    spec = MedusaSpeculator(heads, min_draft_prob=gate)
    assert spec.propose(ctx()) == [7] and spec.gated == 1
    # just under p0*p1*p2: all three pass
    assert MedusaSpeculator(heads, min_draft_prob=p[0] * p[1] * p[2] * 0.999).propose(ctx()) == [7, 3, 5]
    assert MedusaSpeculator(heads, min_draft_prob=1.0).propose(ctx()) == []


def test_the_samplers_adjustments_apply_with_the_drafts_so_far():
    seen = []

    def adjust(logits, preceding):
        seen.append(list(preceding))
        out = logits.clone()
        out[list(set(preceding))] -= 100.0  # a harsh repetition penalty
        return out

    spec = MedusaSpeculator(one_hot_heads([7, 7, 5], [5.0, 5.0, 5.0]))
    drafts = spec.propose(ctx(adjust=adjust))
    assert seen == [[1, 2, 3], [1, 2, 3, 7], [1, 2, 3, 7, drafts[1]]]
    assert drafts[0] == 7 and drafts[1] != 7  # the penalised repeat is not proposed


def test_it_keeps_no_state_and_leaves_commit_and_reset_to_the_defaults():
    spec = MedusaSpeculator(one_hot_heads([7, 3], [5.0, 5.0]))
    first = spec.propose(ctx())
    assert spec.propose(ctx()) == first and spec.can_arm_after_prefix_reuse
    assert spec.proposals == 2
    assert not any(hasattr(spec, member) for member in ("commit", "reset", "handles_own_prefill"))


# -- the factory -------------------------------------------------------------------------
def test_declines_without_a_file():
    with pytest.raises(SpeculatorDeclined) as info:
        make_medusa(ToyTarget(), tsspec.SpeculationOptions())
    assert str(info.value) == NO_FILE_REASON and "--spec-draft-model" in NO_FILE_REASON


def test_declines_a_file_of_another_size(tmp_path):
    narrow = write_random_medusa(tmp_path / "narrow.gguf", 8, 32)
    with pytest.raises(SpeculatorDeclined, match="hidden size 8, the model 16"):
        make_medusa(ToyTarget(), tsspec.SpeculationOptions(spec_draft_model=str(narrow)))
    small = write_random_medusa(tmp_path / "small.gguf", 16, 31)
    with pytest.raises(SpeculatorDeclined, match="vocabulary of 31, the model 32"):
        make_medusa(ToyTarget(), tsspec.SpeculationOptions(draft_model=str(small)))


def test_declines_a_missing_or_foreign_file(tmp_path):
    with pytest.raises(SpeculatorDeclined, match="no such file"):
        make_medusa(ToyTarget(), tsspec.SpeculationOptions(spec_draft_model=str(tmp_path / "nope.gguf")))
    import gguf

    other = tmp_path / "dflash.gguf"
    writer = gguf.GGUFWriter(str(other), "dflash")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(SpeculatorDeclined, match="'dflash', not 'medusa'"):
        make_medusa(ToyTarget(), tsspec.SpeculationOptions(spec_draft_model=str(other)))


def test_options_size_the_speculator(random_medusa):
    import tsspec_medusa

    registry = plugin_catalog({"medusa": tsspec_medusa}).speculators
    options = tsspec.SpeculationOptions(spec_type="medusa", spec_draft_model=str(random_medusa), draft=2, pmin=0.4)
    spec = registry.create(ToyTarget(), options)
    assert spec.max_draft_tokens == 3 and spec.min_draft_prob == 0.4  # one draft per head; the gate set
    gen = tsspec.generate(ToyTarget(), [1, 2, 3], options, max_tokens=4, speculator=spec)
    assert gen.stats.draft_tokens <= 2 * gen.stats.drafts  # the loop's window (--spec-draft 2)
    spec = registry.create(ToyTarget(), tsspec.SpeculationOptions(spec_type="medusa", spec_draft_model=str(random_medusa)))
    assert spec.max_draft_tokens == 3 and spec.min_draft_prob == 0.0  # tsspec's default gate


def test_declines_tapped_hidden_rows_and_leaves_the_taps_alone(random_medusa):
    target = ToyTarget()
    target.spec_set_feature_taps([0, 1])  # what an attached block drafter sets
    with pytest.raises(SpeculatorDeclined, match="32 wide"):
        make_medusa(target, tsspec.SpeculationOptions(spec_draft_model=str(random_medusa)))
    assert target.spec_feature_size == 32


def test_the_registry_explains_every_decline(random_medusa, tmp_path):
    import tsspec_medusa

    registry = plugin_catalog({"medusa": tsspec_medusa}).speculators
    entry = registry.get("medusa")
    assert entry.requires_draft_head and "Medusa" in entry.description
    made = registry.create(ToyTarget(), tsspec.SpeculationOptions(spec_type="medusa"))
    assert made.code == "no_draft_head" and "Medusa" in made.reason and "--spec-draft-model" in made.reason
    narrow = write_random_medusa(tmp_path / "narrow.gguf", 8, 32)
    made = registry.create(ToyTarget(), tsspec.SpeculationOptions(spec_type="medusa", spec_draft_model=str(narrow)))
    assert made.code == "cannot_serve" and "hidden size 8" in made.reason
    refusing = ToyTarget()
    refusing.speculation_refusal = "a test refusal"
    made = registry.create(refusing, tsspec.SpeculationOptions(spec_type="medusa", spec_draft_model=str(random_medusa)))
    assert made.code == "refused"
    made = registry.create(ToyTarget(), tsspec.SpeculationOptions(spec_type="medusa", spec_draft_model=str(random_medusa)))
    assert isinstance(made, MedusaSpeculator)


def test_attach_checks_the_file_and_attaches_nothing(random_medusa, tmp_path):
    target = ToyTarget()
    assert attach_medusa(target, str(random_medusa), None) is None and target.draft_head is None
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF but not really")
    with pytest.raises(TsspecError):
        attach_medusa(target, str(junk), None)


def test_adjustments_see_history_then_drafts_without_a_copy():
    view = ctx(history=(1, 2, 3)).preceding([7, 8])
    assert len(view) == 5 and list(view) == [1, 2, 3, 7, 8]
    assert view[-2:] == [7, 8] and view[1:4] == [2, 3, 7] and view[-1] == 8 and view[0] == 1
    with pytest.raises(IndexError):
        view[5]
