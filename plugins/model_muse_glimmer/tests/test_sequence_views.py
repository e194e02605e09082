"""Per-sequence views of the DFlash assistant a Muse-Glimmer file carries.

The assistant the loader attaches is the block plugin's ``DFlashDraftHead`` (its views are
that plugin's and tested there); this checks them on the real trunk: two sequences over the one
attached head, their head calls interleaved one by one, draft exactly what each drafts alone
(the same proposals and acceptance; output equal to plain decoding, greedy and seeded), where
the shared head without views mixes their contexts; every view reads the one set of weights."""

from __future__ import annotations


import pytest
import torch

from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import (
    assert_views_keep_sequences_apart,
    factory_without_views,
    sequences_alone,
    sequences_interleaved,
)

pytest.importorskip("tsspec_block")

OPTIONS = SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False)
PROMPTS = ([5, 9, 2, 3, 17, 8, 4], [40, 12, 7, 33, 61, 2, 19, 11])
MAX_TOKENS = 20
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.8, top_k=20, seed=7)}


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """Two loads of one Muse-Glimmer file carrying its assistant (one sequence each), sharing
    the first load's attached head."""
    from tsspec_model_muse_glimmer import load_muse_glimmer
    from tsspec_model_muse_glimmer.assistant import carry_drafter
    from tsspec_model_muse_glimmer.convert import convert_assistant

    from .conftest import make_hf_muse, write_model
    from .test_assistant import make_assistant

    where = tmp_path_factory.mktemp("views")
    make_assistant(window=4).save_pretrained(where / "assistant")
    convert_assistant(where / "assistant", where / "dflash.gguf")
    meta, tensors = carry_drafter(str(where / "dflash.gguf"))
    path = write_model(where / "muse.gguf", make_hf_muse(0), extra_metadata=meta, extra_tensors=tensors)
    first, second = load_muse_glimmer(path), load_muse_glimmer(path)
    assert first.draft_head is not None and callable(getattr(first.draft_head, "for_sequence", None))
    second.draft_head = first.draft_head
    return first, second


def _make(target):
    from tsspec_block.speculator import make_block_speculator

    return make_block_speculator(target, OPTIONS)


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_two_interleaved_sequences_draft_what_each_drafts_alone(targets, sampling):
    sampling = SAMPLINGS[sampling]
    assert_views_keep_sequences_apart(targets, PROMPTS, _make, OPTIONS, max_tokens=MAX_TOKENS, sampling=sampling)


def test_the_shared_head_without_views_mixes_the_two_contexts(targets):
    make = factory_without_views(_make)

    alone = sequences_alone(targets, PROMPTS, make, OPTIONS, max_tokens=MAX_TOKENS, sampling=SAMPLINGS["greedy"])
    both = sequences_interleaved(targets, PROMPTS, make, OPTIONS, max_tokens=MAX_TOKENS, sampling=SAMPLINGS["greedy"])
    assert [r["tokens"] for r in both] == [r["tokens"] for r in alone]
    assert [r["proposals"] for r in both] != [r["proposals"] for r in alone]


def test_each_speculator_drives_a_view_over_the_one_set_of_weights(targets):
    import attrs

    head = targets[0].draft_head
    specs = [_make(t) for t in targets]
    views = [s.head for s in specs]
    assert all(s.owns_head for s in specs) and views[0] is not views[1] and head not in views
    assert views[0].weights is views[1].weights is head.weights and views[0].target is head.target

    def storages(obj):
        found = set()
        for f in attrs.fields(type(obj)) if attrs.has(type(obj)) else ():
            value = getattr(obj, f.name)
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, torch.Tensor):
                    found.add(item.untyped_storage().data_ptr())
                elif attrs.has(type(item)):
                    found |= storages(item)
        return found

    weights = storages(head.weights)
    assert len(weights) > 5 and storages(views[0].weights) == weights
    assert all(a is not b for a, b in zip(views[0]._stores, views[1]._stores))
    for s in specs:
        s.close()
