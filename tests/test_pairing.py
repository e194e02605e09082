"""SpeculatorPair (auto's weight-free primary + governed learned backup): who proposes when,
what each member is told, that the output never changes, and how the registry builds it."""

import pytest

from tsspec.protocols import DraftContext, DraftHeadKind
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.governor import PARKED
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
    pair = SpeculatorPair(primary, backup, adaptive=False)
    primary.propose = lambda ctx: [7, 8]
    assert pair.propose(_ctx()) == [7, 8] and pair.source == PRIMARY and backup.calls == 0
    primary.propose = lambda ctx: []
    backup.propose = lambda ctx: [5][: ctx.max_tokens]
    assert pair.propose(_ctx()) == [5] and pair.source == BACKUP
    assert pair.name == "p+b" and pair.sizes_own_drafts and pair.governs_itself


def test_a_parked_member_is_not_asked_and_both_members_see_every_commit():
    primary, backup = Every("p", None, [0]), Every("b", None, [1])
    pair = SpeculatorPair(primary, backup)
    pair.governors[BACKUP]._park()
    assert pair.propose(_ctx()) == [] and primary.calls == 1 and backup.calls == 0
    pair.governors[PRIMARY]._park()
    pair.propose(_ctx())
    assert primary.calls == 1  # parked: not asked either
    pair.commit([1, 2], None, 0)
    assert primary.commits == backup.commits == 1
    assert pair.governor_counts() == (0, 2, 3)  # the backup was asked on two steps, the primary on one


def test_each_members_governor_learns_only_from_its_own_steps():
    pair = SpeculatorPair(Every("p", None, [0]), Every("b", None, [0]))
    gp, gb = pair.governors[PRIMARY], pair.governors[BACKUP]
    pair.source = PRIMARY
    pair.observe_step(True, 5.0, 4, 3)
    assert (gp.spec.seen, gb.spec.seen) == (1, 0)
    pair.source = BACKUP
    pair.observe_step(True, 30.0, 1, 1)
    assert (gp.spec.seen, gb.spec.seen) == (1, 1)
    pair.observe_step(False, 10.0, 1, 0)  # a plain step: both baselines
    assert gp.plain.seen == gb.plain.seen == 1 and pair.proposed == {PRIMARY: 1, BACKUP: 1}
    # a member that sizes its own drafts is not sized by its governor
    sizer = Every("s", None, [0])
    sizer.sizes_own_drafts = True
    assert SpeculatorPair(sizer, Every("b", None, [0])).governors[PRIMARY].size_drafts is False


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_k=8, seed=11)],
                         ids=["greedy", "seeded"])
def test_a_pair_never_changes_the_output(sampling):
    target = ToyTarget()
    want = plain_tokens(target, PROMPT, 40, sampling)
    oracle = OracleSpeculator.from_plain_run(target, PROMPT, 40, sampling=sampling, corrupt=0.3)
    primary = Every("p", oracle, [0, 0, 3, 0, 1])
    backup = RandomSpeculator(target.config.vocab_size, max_draft_tokens=2, seed=4)
    pair = SpeculatorPair(primary, backup, adaptive=False)
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


def test_a_backup_that_lost_starts_the_next_sequence_parked():
    memory = {}
    first = SpeculatorPair(Every("p", None, [0]), Every("b", None, [0]), memory=memory)
    first.reset()
    first.governors[BACKUP]._park()  # lost: parked for the initial backoff, which then doubles
    left, backoff = first.governors[BACKUP].parked_left, first.governors[BACKUP].backoff
    first.close()
    assert memory[BACKUP] == (left, backoff)
    second = SpeculatorPair(Every("p", None, [0]), Every("b", None, [1]), memory=memory)
    second.reset()
    g = second.governors[BACKUP]
    assert g.state == PARKED and g.parked_left == left and g.backoff == backoff and not memory
    assert second.governors[PRIMARY].state != PARKED  # the primary starts fresh
    assert second.propose(_ctx()) == [] and second.backup.calls == 0
    # a sequence that ends unparked leaves no memory: the next one probes the backup afresh
    g.state = "probe"
    second.close()
    assert not memory


def test_the_registry_keeps_one_memory_per_target():
    reg, target = _registry(), ToyTarget()
    target.draft_head = FallbackHead()
    a = reg.create(target, SpeculationOptions(spec_type="auto"))
    b = reg.create(target, SpeculationOptions(spec_type="auto"))
    other = ToyTarget()
    other.draft_head = FallbackHead()
    c = reg.create(other, SpeculationOptions(spec_type="auto"))
    assert a.memory is b.memory and a.memory is not c.memory


def test_a_keyed_member_proposal_is_sized_by_its_governor_and_a_declined_one_goes_to_the_backup():
    from tsspec.protocols import Proposal

    primary, backup = Every("p", None, [0]), Every("b", None, [0])
    seen, heard = [], []
    primary.observe_step = lambda *args: seen.append(args)  # members hear every step too...
    backup.observe_step = lambda *args: heard.append(args)
    pair = SpeculatorPair(primary, backup)
    gp = pair.governors[PRIMARY]
    primary.propose = lambda ctx: Proposal([7, 8, 9], evidence="k")
    backup.propose = lambda ctx: [5]
    assert pair.propose(_ctx()) == [7] and pair.evidence == "k"  # a probe: one token
    for _ in range(6):
        gp.record(False, 10.0, 1)  # a baseline (the first sample is warm-up)
    for _ in range(12):
        gp.record(True, 12.0, 1, drafted=1, evidence="k")  # key k never lands
        gp.record(True, 16.0, 5, drafted=4, evidence="w")  # key w always does: the member wins
    assert gp.state != PARKED and gp.size_proposal(3, "k") == 0
    gp._declines.clear()
    assert pair.propose(_ctx()) == [5] and pair.source == BACKUP and pair.declined_drafts == 1
    pair.observe_step(True, 9.0, 2, 1)  # ...the backup's verify as its own, the primary's as not
    assert seen == [(False, 9.0, 2, 0)] and heard == [(True, 9.0, 2, 1)] and pair.evidence is None
    primary.propose = lambda ctx: Proposal([7, 8], evidence="w")
    assert pair.propose(_ctx()) and pair.source == PRIMARY
    pair.observe_step(True, 8.0, 3, 2)
    pair.observe_step(False, 7.0, 1, 0)
    assert seen[1:] == [(True, 8.0, 3, 2), (False, 7.0, 1, 0)] and heard[1:] == [(False, 8.0, 3, 0), (False, 7.0, 1, 0)]


def test_a_confident_backup_is_sized_by_and_teaches_its_governors_calibration():
    from tsspec.protocols import Proposal

    primary, backup = Every("p", None, [0]), Every("b", None, [0])
    pair = SpeculatorPair(primary, backup)
    gb = pair.governors[BACKUP]
    primary.propose = lambda ctx: []
    backup.propose = lambda ctx: Proposal([5, 6], confidence=[0.95, 0.9])
    assert pair.propose(_ctx()) == [5] and pair.confidence == [0.95]  # a probe: one token
    pair.observe_step(True, 12.0, 2, 1)
    assert gb.calibration.reached[9] == 1 and gb.calibration.landed[9] == 1
    assert pair.confidence is None
    backup.propose = lambda ctx: Proposal([5, 6], confidence=[0.95])  # malformed: sized without it
    assert pair.propose(_ctx()) == [5, 6] and pair.confidence is None


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
