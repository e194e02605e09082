"""The whole loop (ngram, cost governor, draft economics) replayed over real greedy outputs on a
virtual clock: the drafting policy's speed-up without the machine's noise.

Why: wall-clock benchmarks on a shared 2-core machine move by 10-30% between runs, more than
most policy changes gain. Under greedy decoding the output is plain decoding's, so a target that
"predicts" the recorded greedy output at every position (``ReplayTarget``) and charges each
forward the verify cost of its row count on a ``VirtualClock`` reproduces exactly what the loop
would draft, verify, decline and park on the real model, and what it would cost under that
cost profile. Only the forward's cost is modelled; the loop's own Python time is not.

Sequences: the bench prompt set's greedy outputs on the embedded model, decoded once and cached
(``acceptance.bench_sequences``, ``--cache``). Cost by rows: ``--row-ms`` (``R:MS,..``), else
the profile the governor check simulates (``tsspec_bench.governor_check.VERIFY_COST_PROFILE``),
or ``--measured`` for the one the target measures on this machine (``spec_verify_row_ms``).

Oracle (``--oracle``): the ceiling of ngram's proposals under the same settings. Each proposal
is cut to exactly the tokens of it that land (the oracle reads the recorded future) and an
empty cut declines the step, and the loop leaves the cut whole (``sizes_own_drafts``): what a
perfect sizing of today's candidates would reach; a better candidate rule raises this ceiling,
a better key or sizing only moves the policy towards it.

Keys (``--keys``): per evidence key of the policy's proposals, how many were made, how many the
loop verified, and of the verified the share whose first token landed and the tokens landed
per verified draft: whether the key separates drafts that land from drafts that do not.

Run::

    python plugins/spec_ngram/scripts/loop_replay.py --cache /tmp/ngram_bench.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from tsspec import Proposal
from tsspec_bench.governor_check import VERIFY_COST_PROFILE, VirtualClock
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.testing import ToyTarget
from tsspec_ngram.speculator import NGramSpeculator

sys.path.insert(0, str(Path(__file__).parent))
from acceptance import bench_sequences, parse_row_ms, verify_ms  # noqa: E402

GROUNDED = ("code-edit", "summary", "qa", "rewrite")
BASE_MS = 10.0  # one row's cost; only ratios are reported
# the speed goal for the verify: 9 rows at most 1.5x one row (linear between)
GOAL_PROFILE = ((1, 1.0), (9, 1.5))


class Watch:
    """Wraps ``NGramSpeculator.propose`` for one replayed sequence: with ``oracle``, cuts each
    proposal to the tokens of it that land (read from the recorded ``sequence``); always
    records (key, proposed tokens, tokens that would land) per proposal, for ``--keys``."""

    def __init__(self) -> None:
        self.sequence: list[int] | None = None
        self.oracle = False
        self.proposals: list[tuple[object, int, int]] = []
        self._plain = NGramSpeculator.propose
        self._init = NGramSpeculator.__init__

    def install(self) -> None:
        watch = self

        def propose(speculator, ctx):
            draft = watch._plain(speculator, ctx)
            if not draft or watch.sequence is None:
                return draft
            future = watch.sequence[len(ctx.history):]
            landed = 0
            while landed < len(draft) and landed < len(future) and draft[landed] == future[landed]:
                landed += 1
            key = getattr(draft, "evidence", None)
            watch.proposals.append((key, len(draft), landed))
            if not watch.oracle:
                return draft
            return Proposal(list(draft[:landed]), evidence=key) if landed else []

        def init(speculator, *args, **kwargs):
            watch._init(speculator, *args, **kwargs)
            if watch.oracle:
                speculator.sizes_own_drafts = True  # the loop must not cut the oracle's cut

        NGramSpeculator.propose = propose
        NGramSpeculator.__init__ = init


class ReplayTarget(ToyTarget):
    """A pure-KV toy whose logits row at position p is one-hot on ``sequence[p + 1]`` (the
    recorded greedy output), each forward advancing ``clock`` by its modelled cost."""

    def __init__(self, sequence: list[int], vocab: int, clock: VirtualClock, row_ms):
        super().__init__(vocab_size=vocab, hidden_size=4, recurrent=False, max_context=len(sequence) + 64)
        self.sequence, self.clock, self.row_ms = sequence, clock, row_ms

    def spec_forward(self, tokens, *, all_logits_rows: bool, want_hidden: bool):
        start = self.cache_seq_len
        self.clock.advance(BASE_MS * verify_ms(len(tokens), self.row_ms) / verify_ms(1, self.row_ms) / 1000.0)
        logits, hidden = super().spec_forward(tokens, all_logits_rows=all_logits_rows, want_hidden=want_hidden)
        rows = logits.shape[0]
        out = torch.zeros(rows, self.config.vocab_size, dtype=torch.float64)  # [rows, vocab]
        first = start + len(tokens) - rows
        for i in range(rows):
            pos = first + i + 1
            out[i, self.sequence[pos] if pos < len(self.sequence) else 0] = 1.0
        return out, hidden


WATCH = Watch()


def replay(item: dict, options: SpeculationOptions, row_ms) -> tuple[float, object]:
    """(decode ms on the virtual clock, stats) of one recorded sequence under ``options``."""
    sequence = item["prompt"] + item["output"]
    WATCH.sequence = sequence
    clock = VirtualClock()
    target = ReplayTarget(sequence, max(sequence) + 1, clock, row_ms)
    gen = generate(target, list(item["prompt"]), options, max_tokens=len(item["output"]), clock=clock)
    if gen.tokens != item["output"]:
        raise SystemExit(f"{item['name']}: the replay diverged from the recorded output")
    return gen.stats.decode_ms, gen.stats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help="JSON file for the greedy sequences")
    parser.add_argument("--row-ms", type=parse_row_ms, default=None, metavar="R:MS,...")
    parser.add_argument("--measured", action="store_true", help="the target's own measured cost by rows")
    parser.add_argument("--settings", default="{}", help='ngram settings as JSON, e.g. \'{"fallback": false}\'')
    parser.add_argument("--classes", default=None, metavar="A,B")
    parser.add_argument("--goal", action="store_true", help="the speed goal's cost: 9 rows 1.5x one row")
    parser.add_argument("--oracle", action="store_true", help="cut every proposal to what lands (the ceiling)")
    parser.add_argument("--keys", action="store_true", help="per evidence key: proposals, verified, landing")
    parser.add_argument("--quiet", action="store_true", help="no line per prompt")
    args = parser.parse_args(argv)
    row_ms = args.row_ms or (GOAL_PROFILE if args.goal else VERIFY_COST_PROFILE)
    WATCH.install()
    WATCH.oracle = args.oracle
    if args.measured:
        from tsspec_gguf.embedded import embedded_model_path
        from tsspec.runtime.loading import load_model

        row_ms = load_model(embedded_model_path()).spec_verify_row_ms or row_ms
    print("cost by rows (relative):", ", ".join(f"{r}: {verify_ms(r, row_ms) / verify_ms(1, row_ms):.2f}" for r, _ in row_ms))
    classes = set(args.classes.split(",")) if args.classes else None
    options = SpeculationOptions(spec_type="ngram", extra={"ngram": json.loads(args.settings)})
    ratios: dict[str, list[float]] = {}
    key_stats: dict[tuple[bool, object], list[int]] = {}  # (grounded?, key) -> proposals, first landed, landed
    for item in bench_sequences(args.cache, None):
        if classes and item["class"] not in classes:
            continue
        plain_ms, _ = replay(item, SpeculationOptions(enabled=False), row_ms)
        start = len(WATCH.proposals)
        spec_ms, st = replay(item, options, row_ms)
        for key, proposed, landed in WATCH.proposals[start:]:
            per_key = key_stats.setdefault((item["class"] in GROUNDED, key), [0, 0, 0])
            per_key[0] += 1
            per_key[1] += landed > 0
            per_key[2] += landed
        ratios.setdefault(item["class"], []).append(plain_ms / spec_ms)
        if not args.quiet:
            print(f"{item['name']:12s} {plain_ms / spec_ms:.3f}x  verify {st.verify_steps}/{st.steps} steps, accepted "
              f"{st.accepted_tokens}/{st.draft_tokens}, governor {st.governor_wins}/{st.governor_losses}/"
              f"{st.governor_parked_steps}, declined {st.declined_drafts}")
    for cls, values in ratios.items():
        print(f"{cls:10s} median {statistics.median(values):.3f}x")
    grounded = [v for c in GROUNDED for v in ratios.get(c, [])]
    every = [v for values in ratios.values() for v in values]
    if grounded:
        print(f"grounded   median {statistics.median(grounded):.3f}x")
    print(f"all        median {statistics.median(every):.3f}x")
    if args.keys:
        print("proposals by key (grounded / other classes): count, first token lands, tokens landing per proposal")
        for (grounded, key), (count, first, landed) in sorted(key_stats.items(), key=lambda kv: (not kv[0][0], str(kv[0][1]))):
            print(f"  {'grounded' if grounded else 'other   '} {str(key):16s} {count:5d}  {first / count:.2f}  {landed / count:.2f}")


if __name__ == "__main__":
    main()
