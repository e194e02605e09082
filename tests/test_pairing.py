"""SpeculatorPair (auto's weight-free primary + learned backup): who proposes when, what each
member is told, that the output never changes, and how the registry builds it."""

import pytest

from tsspec.protocols import DraftContext, DraftHeadKind
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.pairing import BACKUP, PRIMARY, SpeculatorPair
from tsspec.runtime.registry import SpeculatorRegistry
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import OracleSpeculator, RandomSpeculator, SilentSpeculator as Named, ToyTarget, plain_tokens

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


class Every:
    """Proposes ``pattern[i % len]`` tokens of the oracle sequence on call i (0: nothing)."""

    needs_hidden_state = False
    can_arm_after_prefix_reuse = True

    def __init__(self, name, oracle, pattern):
        self.name, self.oracle, self.pattern = name, oracle, pattern
        self.calls = self.commits = 0
        self.max_tokens_seen = []

    def propose(self, ctx):
        n = self.pattern[self.calls % len(self.pattern)]
        self.calls += 1
        self.max_tokens_seen.append(ctx.max_tokens)
        return self.oracle.propose(ctx)[:n] if n else []

    def commit(self, tokens, hidden_rows, start_pos):
        self.commits += 1

    def reset(self):
        pass


def _ctx(max_tokens=8):
    return DraftContext(last_token=1, position=0, max_tokens=max_tokens, history=(1,))


def test_the_backup_proposes_only_where_the_primary_finds_nothing():
    primary = Every("p", None, [0])
    backup = Every("b", None, [0])
    pair = SpeculatorPair(primary, backup)
    primary.propose = lambda ctx: [7, 8]
    assert pair.propose(_ctx()) == [7, 8] and pair.source == PRIMARY and backup.calls == 0
    primary.propose = lambda ctx: []
    backup.propose = lambda ctx: [5][: ctx.max_tokens]
    assert pair.propose(_ctx()) == [5] and pair.source == BACKUP
    assert pair.name == "p+b" and pair.proposed == {PRIMARY: 1, BACKUP: 1}


def test_both_members_see_every_commit_and_reset():
    primary, backup = Every("p", None, [0]), Every("b", None, [1])
    pair = SpeculatorPair(primary, backup)
    pair.commit([1, 2], None, 0)
    pair.reset()
    pair.close()
    assert primary.commits == backup.commits == 1
    assert pair.max_draft_tokens is None and pair.can_arm_after_prefix_reuse


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_k=8, seed=11)],
                         ids=["greedy", "seeded"])
def test_a_pair_never_changes_the_output(sampling):
    target = ToyTarget()
    want = plain_tokens(target, PROMPT, 40, sampling)
    oracle = OracleSpeculator.from_plain_run(target, PROMPT, 40, sampling=sampling, corrupt=0.3)
    primary = Every("p", oracle, [0, 0, 3, 0, 1])
    backup = RandomSpeculator(target.config.vocab_size, max_draft_tokens=2, seed=4)
    pair = SpeculatorPair(primary, backup)
    gen = generate(target, PROMPT, SpeculationOptions(spec_type="pair", adaptive=False), max_tokens=40,
                   sampling=sampling, speculator=pair)
    assert gen.tokens == want
    assert pair.proposed[PRIMARY] > 0 and pair.proposed[BACKUP] > 0
    assert max(primary.max_tokens_seen) > 2  # the primary is not cut to the backup's length


class FallbackHead:
    kind = DraftHeadKind.PER_TOKEN
    auto_fallback = True


def _registry(free_declines=False):
    from tsspec.protocols import SpeculatorDeclined

    def free(target, options):
        if free_declines:
            raise SpeculatorDeclined("no")
        return Named("ngram")

    reg = SpeculatorRegistry()
    reg.register("ngram", free, requires_draft_head=False, weight_free=True)
    reg.register("draft-head", lambda t, o: Named("draft-head"), requires_draft_head=True,
                 serves_kind=DraftHeadKind.PER_TOKEN)
    return reg


def test_auto_pairs_a_fallback_drafter_with_the_weight_free_choice(monkeypatch):
    target = ToyTarget()
    target.draft_head = FallbackHead()
    made = _registry().create(target, SpeculationOptions(spec_type="auto"))
    assert isinstance(made, SpeculatorPair) and made.name == "ngram+draft-head"
    # asked by name, or a head that does not ask for it, or a primary that declines: no pair
    assert _registry().create(target, SpeculationOptions(spec_type="draft-head")).name == "draft-head"
    assert _registry(free_declines=True).create(target, SpeculationOptions(spec_type="auto")).name == "draft-head"
    monkeypatch.setattr(FallbackHead, "auto_fallback", "yes")  # only a plain True pairs
    assert _registry().create(target, SpeculationOptions(spec_type="auto")).name == "draft-head"


def test_a_confident_backup_keeps_its_confidence_for_the_loops_calibration():
    from tsspec.protocols import Proposal

    primary, backup = Every("p", None, [0]), Every("b", None, [0])
    pair = SpeculatorPair(primary, backup)
    backup.propose = lambda ctx: Proposal([5, 6], confidence=[0.95, 0.9])
    made = pair.propose(_ctx())
    assert made == [5, 6] and made.confidence == [0.95, 0.9] and pair.source == BACKUP


def test_auto_plan_names_what_auto_runs_without_building_it():
    target = ToyTarget()
    assert _registry().auto_plan(target) == "ngram"
    target.draft_head = FallbackHead()
    assert _registry().auto_plan(target) == "ngram+draft-head"
    assert SpeculatorRegistry().auto_plan(ToyTarget()).code == "no_draft_head"


def test_the_listing_says_what_auto_runs_and_with_which_drafter():
    from tsspec.cli.plugins_cmd import _auto_line

    line = _auto_line("ngram+draft-head", "/x/mtp.gguf")
    assert line.startswith("ngram+draft-head: ngram proposes first, draft-head (drafter /x/mtp.gguf) where ngram")
    assert _auto_line("ngram", None) == "ngram" and _auto_line("draft-head", "/x/h.gguf") == "draft-head (drafter /x/h.gguf)"
