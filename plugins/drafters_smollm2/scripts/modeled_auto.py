"""The shipped MTP drafter, ngram and ``auto``'s pair on the bench prompts, timed by a cost MODEL.

Why: on a shared 2-core machine the same algorithm's paired speed-up swings by 0.5x and more
between pairs, so a per-class order of draft-head, ngram and their pair cannot be read from
wall clocks. This script runs the real model, the real drafter and the real decisions, but the
loop's clock is virtual: a forward of r rows advances it by ``plain_ms * shape(r)``, a head call
by ``head_ms``, an ngram lookup by ``lookup_ms``, a head commit by ``commit_ms``; the cost
governors see those times (and the shape as the target's ``spec_verify_row_ms``). Output and
every decision are deterministic, and the figures say what each algorithm's decisions are worth
on a machine with those costs. They are a MODEL, not a measurement: the paired ``tsspec bench``
runs are the measurement, this is what separates the algorithms where those are noise.

    python plugins/drafters_smollm2/scripts/modeled_auto.py --head-ms 1.0 --head-ms 0.3
"""

from __future__ import annotations

import argparse
import statistics
import types

from tsspec_bench.governor_check import VERIFY_COST_PROFILE, VirtualClock
from tsspec_bench.prompts import encode_case, load_prompt_set, select_cases
from tsspec_gguf.embedded import embedded_model_path
from tsspec.runtime.defaults import default_catalog
from tsspec.runtime.generation import generate
from tsspec.runtime.loading import load_model
from tsspec.runtime.options import SpeculationOptions

MTP = "smollm2-135m-instruct-mtp.gguf"


def _relative(shape, rows: int) -> float:
    """The shape's cost of ``rows`` rows relative to one row (linear between points, the last
    segment's slope past the end)."""
    for (r0, c0), (r1, c1) in zip(shape, shape[1:]):
        if rows <= r1:
            return c0 + (c1 - c0) * (max(rows, r0) - r0) / (r1 - r0)
    (r0, c0), (r1, c1) = shape[-2], shape[-1]
    return c1 + (c1 - c0) / (r1 - r0) * (rows - r1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plain-ms", type=float, default=6.4, help="one-row forward (ms)")
    ap.add_argument("--head-ms", type=float, action="append", help="head call (ms); repeat for several")
    ap.add_argument("--lookup-ms", type=float, default=0.03)
    ap.add_argument("--commit-ms", type=float, default=0.08)
    ap.add_argument("--two-rows", type=float, default=None,
                    help="a 2-row forward relative to one row (default: the governor check's profile)")
    ap.add_argument("--algorithms", default="ngram,draft-head,auto")
    ap.add_argument("--classes", default=None)
    args = ap.parse_args(argv)
    shape = [(1, 1.0), *VERIFY_COST_PROFILE[1:]]
    if args.two_rows is not None:  # scale the profile's extra-row costs to this 2-row figure
        k = (args.two_rows - 1.0) / (VERIFY_COST_PROFILE[1][1] - 1.0)
        shape = [(r, 1.0 + k * (c - 1.0)) for r, c in shape]
    from importlib import resources

    drafter = str(resources.files("tsspec_drafters_smollm2") / MTP)
    catalog = default_catalog()
    clock = VirtualClock()
    options = SpeculationOptions(spec_type="draft-head", spec_draft_model=drafter)
    target = load_model(str(embedded_model_path()), options=options, catalog=catalog)
    head = target.draft_head
    state = {"head_ms": 0.0}

    forward = target.spec_forward

    def timed_forward(tokens, **kw):
        out = forward(tokens, **kw)
        clock.advance(args.plain_ms * _relative(shape, len(tokens)) / 1000.0)
        return out

    target.spec_forward = timed_forward
    type(target).spec_verify_row_ms = property(lambda self: tuple((r, args.plain_ms * c) for r, c in shape))

    def charge(obj, name, ms_of):
        method = getattr(obj, name, None)
        if method is None:
            return

        def wrapped(*a, **kw):
            out = method(*a, **kw)
            clock.advance(ms_of() / 1000.0)
            return out

        setattr(obj, name, wrapped)

    import tsspec_draft_head.speculator as head_module
    import tsspec_ngram.speculator as ngram_module

    head_module.time = types.SimpleNamespace(perf_counter=clock)  # the head times its own calls
    lookup = ngram_module.NGramSpeculator.propose

    def ngram_propose(self, ctx):
        out = lookup(self, ctx)
        clock.advance(args.lookup_ms / 1000.0)
        return out

    ngram_module.NGramSpeculator.propose = ngram_propose
    commit = head_module.DraftHeadSpeculator.commit

    def head_commit(self, *a, **kw):
        out = commit(self, *a, **kw)
        clock.advance(args.commit_ms / 1000.0)
        return out

    head_module.DraftHeadSpeculator.commit = head_commit

    cases = select_cases(load_prompt_set(), args.classes.split(",") if args.classes else None, 1)
    algorithms = args.algorithms.split(",")
    print(f"cost model: plain {args.plain_ms} ms, rows {[(r, round(c, 3)) for r, c in shape]}, "
          f"lookup {args.lookup_ms} ms, head commit {args.commit_ms} ms")
    for head_ms in args.head_ms or [1.0]:
        state["head_ms"] = head_ms
        views = []

        def view_factory(make=head.for_sequence):
            view = make()
            for name in ("draft_step", "draft_catch_up_and_step"):
                charge(view, name, lambda: state["head_ms"])
            views.append(view)
            return view

        head.for_sequence = view_factory
        print(f"\nhead call {head_ms} ms: modeled speed-up over plain (tokens per verify; declined; parked steps)")
        print("| class | " + " | ".join(algorithms) + " |")
        print("|---|" + "---|" * len(algorithms))
        ratios = {a: [] for a in algorithms}
        for case in cases:
            enc = encode_case(target, case)
            ids = list(enc.prompt_ids)
            plain = generate(target, ids, SpeculationOptions(enabled=False), max_tokens=enc.max_tokens, clock=clock)
            plain_ms = plain.stats.decode_ms
            cells = []
            for algorithm in algorithms:
                opts = SpeculationOptions(spec_type=algorithm, spec_draft_model=drafter)
                spec = catalog.speculators.create(target, opts)
                if hasattr(spec, "clock"):
                    spec.clock = clock  # auto's pair times its members' attempts
                run = generate(target, ids, opts, max_tokens=enc.max_tokens, speculator=spec, clock=clock,
                               registry=catalog.speculators)
                assert run.tokens == plain.tokens, f"{case.id} {algorithm}: output differs from plain"
                s = run.stats
                ratio = plain_ms / s.decode_ms * (len(run.tokens) - 1) / max(1, len(plain.tokens) - 1)
                ratios[algorithm].append(ratio)
                cells.append(f"{ratio:.2f}x ({s.tokens_per_verify:.2f}; {s.declined_drafts}; {s.governor_parked_steps})")
            print(f"| {case.cls} | " + " | ".join(cells) + " |")
        print("| **all** (median) | " + " | ".join(f"{statistics.median(ratios[a]):.2f}x" for a in algorithms) + " |")
        head.for_sequence = view_factory.__defaults__[0]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
