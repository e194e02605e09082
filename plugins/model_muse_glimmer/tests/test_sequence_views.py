"""Per-sequence views of the DFlash assistant a Muse-Glimmer file carries.

The assistant the loader attaches is the block plugin's ``DFlashDraftHead`` (its views are
that plugin's and tested there); this checks them on the real trunk: two sequences over the one
attached head, their head calls interleaved one by one, draft exactly what each drafts alone
(the same proposals and acceptance; output equal to plain decoding, greedy and seeded), where
the shared head without views mixes their contexts; every view reads the one set of weights."""

from __future__ import annotations

import threading

import pytest
import torch

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams

pytest.importorskip("tsspec_block")

OPTIONS = SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False)
PLAIN = SpeculationOptions(enabled=False)
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


class Turns:
    """Two sequences take turns: each head-touching call (propose, commit) of one runs only after
    the other's previous one, so their head calls interleave one by one (until one finishes)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._turn = 0
        self._done: set[int] = set()

    def run(self, who: int, fn, *args):
        with self._cond:
            self._cond.wait_for(lambda: self._turn == who or (1 - who) in self._done, timeout=60)
        try:
            return fn(*args)
        finally:
            with self._cond:
                self._turn = 1 - who
                self._cond.notify_all()

    def finish(self, who: int) -> None:
        with self._cond:
            self._done.add(who)
            self._cond.notify_all()


class Recorder:
    """A speculator that records its proposals and, given ``turns``, waits for its turn."""

    def __init__(self, inner, turns: Turns | None = None, who: int = 0):
        self.inner, self.turns, self.who, self.proposals = inner, turns, who, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _call(self, fn, *args):
        return fn(*args) if self.turns is None else self.turns.run(self.who, fn, *args)

    def propose(self, ctx):
        drafts = self._call(self.inner.propose, ctx)
        self.proposals.append(list(drafts))
        return drafts

    def commit(self, tokens, hidden_rows, start_pos):
        return self._call(self.inner.commit, tokens, hidden_rows, start_pos)


def _run(target, prompt, sampling, speculator):
    out = generate(target, list(prompt), OPTIONS, max_tokens=MAX_TOKENS, sampling=sampling, speculator=speculator)
    return {"tokens": list(out.tokens), "proposals": speculator.proposals,
            "accepted": out.stats.accepted_tokens, "drafted": out.stats.draft_tokens}


def _alone(targets, sampling, make):
    return [_run(t, p, sampling, Recorder(make(t))) for t, p in zip(targets, PROMPTS)]


def _interleaved(targets, sampling, make):
    turns, results, errors = Turns(), [None, None], []

    def one(who):
        try:
            results[who] = _run(targets[who], PROMPTS[who], sampling, Recorder(make(targets[who]), turns, who))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            turns.finish(who)

    threads = [threading.Thread(target=one, args=(who,)) for who in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


class NoViews:
    """The same head, minus ``for_sequence``: what every speculator drove before views."""

    def __init__(self, head):
        self._head = head

    def __getattr__(self, name):
        if name == "for_sequence":
            raise AttributeError(name)
        return getattr(self._head, name)


def _make(target):
    from tsspec_block.speculator import make_block_speculator

    return make_block_speculator(target, OPTIONS)


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_two_interleaved_sequences_draft_what_each_drafts_alone(targets, sampling):
    sampling = SAMPLINGS[sampling]
    alone = _alone(targets, sampling, _make)
    both = _interleaved(targets, sampling, _make)
    for who, (solo, mixed) in enumerate(zip(alone, both)):
        plain = generate(targets[who], list(PROMPTS[who]), PLAIN, max_tokens=MAX_TOKENS, sampling=sampling)
        assert solo["tokens"] == mixed["tokens"] == list(plain.tokens)  # lossless either way
        assert mixed["proposals"] == solo["proposals"], f"sequence {who} drafted differently beside the other"
        assert (mixed["accepted"], mixed["drafted"]) == (solo["accepted"], solo["drafted"])
        assert solo["drafted"] > 0


def test_the_shared_head_without_views_mixes_the_two_contexts(targets):
    real = targets[0].draft_head
    shared = NoViews(real)

    def make(target):
        target.draft_head = shared
        try:
            return _make(target)
        finally:
            target.draft_head = real

    alone = _alone(targets, SAMPLINGS["greedy"], make)
    both = _interleaved(targets, SAMPLINGS["greedy"], make)
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
