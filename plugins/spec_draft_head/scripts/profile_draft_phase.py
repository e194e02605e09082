"""Where the draft phase's time goes in the REAL loop (``tsspec generate``), piece by piece.

Runs ``tsspec generate`` in this process with timers wrapped around every piece of the draft
phase (the loop's ``_propose``, the speculator's ``propose`` / ``_first_step`` / ``_gate``, the
head's ``draft_catch_up_and_step`` / ``_advance``, the native engine's ``forward`` / ``logits``
and each kernel call, the embedding lookup, the proposal checks). Each piece's time is
EXCLUSIVE (its children's taken out), so the rows add up to the draft phase. Then the same head
calls and gates are replayed back to back on their recorded inputs, with no target step between
them (weights warm, no other work in the caches): the "isolated" column.

    python plugins/spec_draft_head/scripts/profile_draft_phase.py [--dtype int8] [--head-threads 1]

Timers cost ~0.5 us each; the "draft phase (loop's timer)" row is the loop's own phase time.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

PROMPT = "Write a short story about a lighthouse keeper."
PROPOSE = "loop: _propose (validate, confidence, glue)"
REPLAY = "replay"
RECORDING = "(recording the replay's inputs)"  # timed, left out of the table and its TOTAL
ROOTS = (PROPOSE, REPLAY)  # what a sample is: one draft phase, or one replayed head call + gate


class Timers:
    """Exclusive microseconds per named piece: summed per outermost call (one draft phase, or
    one replayed head call), so medians over those are robust to the scheduler taking the core
    away mid-call on a shared machine."""

    def __init__(self):
        self.samples: list[dict[str, float]] = []  # one per outermost call: name -> exclusive us
        self.current = collections.defaultdict(float)
        self.stack: list[list] = []  # [name, start_ns, children_ns]

    def wrap(self, name, fn):
        timers = self

        def timed(*a, **kw):
            frame = [name, time.perf_counter_ns(), 0]
            timers.stack.append(frame)
            try:
                return fn(*a, **kw)
            finally:
                timers.stack.pop()
                spent = time.perf_counter_ns() - frame[1]
                timers.current[name] += (spent - frame[2]) / 1000.0
                if timers.stack:
                    timers.stack[-1][2] += spent
                else:  # an outermost call: one sample if it is a draft phase or a replayed call
                    if name in ROOTS:
                        timers.samples.append(dict(timers.current))
                    timers.current.clear()

        return timed

    def reset(self):
        self.samples.clear()
        self.current.clear()

    def table(self) -> dict[str, tuple[float, float]]:
        """name -> (median, mean) us per outermost call (0 where a call had none)."""
        names = {n for s in self.samples for n in s} - {RECORDING}
        out = {}
        for n in names:
            values = [s.get(n, 0.0) for s in self.samples]
            out[n] = (statistics.median(values), statistics.fmean(values))
        totals = [sum(v for n, v in s.items() if n != RECORDING) for s in self.samples]
        out["TOTAL"] = (statistics.median(totals), statistics.fmean(totals)) if totals else (0.0, 0.0)
        return out


class TimedKernels:
    """The compiled kernels with every call timed under ``kernel NAME``."""

    def __init__(self, k, timers):
        self._k, self._t = k, timers

    def __getattr__(self, name):
        return self._t.wrap(f"kernel {name}", getattr(self._k, name))


def install(timers: Timers, record: list):
    """Wrap the draft phase's pieces (class attributes: every instance made later is timed)."""
    from tsspec.runtime import execution
    from tsspec_draft_head import native_head, nextn_file, speculator

    S, H, N, E = speculator.DraftHeadSpeculator, nextn_file.NextNFileHead, native_head.NativeNextN, native_head.EmbeddingRows
    X = execution.SpeculativeExecution
    X._propose = timers.wrap(PROPOSE, X._propose)
    execution.validate_proposal = timers.wrap("loop: validate_proposal", execution.validate_proposal)
    execution.proposal_confidence = timers.wrap("loop: proposal_confidence", execution.proposal_confidence)
    S.propose = timers.wrap("spec: propose (glue)", S.propose)
    S._first_step = timers.wrap("spec: _first_step (stack pending rows)", S._first_step)
    S._step = timers.wrap("spec: _step", S._step)
    S._gate = timers.wrap("spec: _gate (top-1 over top-10)", S._gate)
    call = H.draft_catch_up_and_step
    recording = [True]

    def keep(*entry):  # the replay's inputs, copied: timed apart, left out of the table
        record.append(tuple(x.clone() if hasattr(x, "clone") else x for x in entry))

    keep = timers.wrap(RECORDING, keep)

    def recorded(self, tokens, rows, start, **kw):
        out = call(self, tokens, rows, start, **kw)
        if recording[0]:
            keep(self, list(tokens), rows, int(start), kw)
        return out

    gated = H.draft_gated

    def recorded_gated(self, tokens, rows, start, cut, *a, last=None):
        out = gated(self, tokens, rows, start, cut, *a, last=last)
        if recording[0]:  # the rows as draft_gated reads them: [n, H]
            n = len(tokens)
            keep(self, list(tokens), rows, last, int(start), {"cut": cut})
        return out

    H.draft_catch_up_and_step = timers.wrap("head: draft_catch_up_and_step (lock, glue)", recorded)
    H.draft_gated = timers.wrap("head: draft_gated (lock, checks, place)", recorded_gated)
    H._advance = timers.wrap("head: _advance (checks, place, ensure)", H._advance)
    H._advance_native = timers.wrap("head: _advance_native (checks, place, ensure)", H._advance_native)
    H._inputs = timers.wrap("head: _inputs (checks, place, counts)", H._inputs)
    N.step = timers.wrap("native: step (torch allocs, glue)", N.step)
    N.step_gated = timers.wrap("native: step_gated (glue)", N.step_gated)
    E.slots = timers.wrap("native: embedding slots", E.slots)
    N.forward = timers.wrap("native: forward (torch allocs, glue)", N.forward)
    N.logits = timers.wrap("native: logits (glue)", N.logits)
    N._rope_from = timers.wrap("native: _rope_from", N._rope_from)
    E.__call__ = timers.wrap("native: embedding rows", E.__call__)
    init = N.__init__

    def timed_init(self, *a, **kw):
        init(self, *a, **kw)
        self._k = TimedKernels(self._k, timers)

    N.__init__ = timed_init
    return recording


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default=None, help="the target's --dtype (e.g. int8)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--head-threads", type=int, default=0, help="kernel threads of the head (0: its default)")
    ap.add_argument("--prompt", default=PROMPT)
    args = ap.parse_args()

    timers, record = Timers(), []
    recording = install(timers, record)
    if args.head_threads:
        from tsspec_draft_head import native_head

        init = native_head.NativeNextN.__init__

        def with_threads(self, *a, **kw):
            init(self, *a, **kw)
            self.threads = args.head_threads

        native_head.NativeNextN.__init__ = with_threads

    from tsspec.runtime import execution

    phase_ms = {}
    finish = execution.SpeculativeExecution.finish

    def keep_stats(self):
        finish(self)
        phase_ms.update(self.stats.phase_ms)
        phase_ms["verify_steps"] = self.stats.verify_steps
        phase_ms["steps"] = self.stats.steps

    execution.SpeculativeExecution.finish = keep_stats
    from tsspec.cli.app import main as cli

    argv = ["generate", "--chat", "--max-tokens", str(args.max_tokens), "--spec-type", "draft-head",
            "--no-spec-adaptive", "--spec-pmin", "0.4", "--spec-draft", "1", "-p", args.prompt]
    if args.dtype:
        argv += ["--dtype", args.dtype]
    try:
        cli(argv)
    except SystemExit as exc:
        if exc.code:
            raise
    print()
    loop = timers.table()
    proposals = len(timers.samples)

    # isolation: the same head calls and gates back to back, on their recorded inputs, each
    # (head call + gate) one sample
    timers.reset()
    recording[0] = False
    from tsspec_draft_head.confidence import top1_over_topk

    def replay(head, tokens, rows, *rest):
        if len(rest) == 3:  # the head ran the gate itself (draft_gated): rows, last as it was given them
            last, start, kw = rest
            head.draft_gated(tokens, rows, start, kw["cut"], last=last)
            return
        start, kw = rest
        logits, _ = head.draft_catch_up_and_step(tokens, rows, start, **kw)
        gate(logits)

    gate = timers.wrap("spec: _gate (top-1 over top-10)", lambda logits: top1_over_topk(logits))
    call = timers.wrap(REPLAY, replay)
    for rep in range(3):
        for entry in record:
            call(*entry)
    iso = timers.table()
    names = sorted(set(loop) | set(iso), key=lambda n: (n == "TOTAL", -loop.get(n, (0.0, 0.0))[1]))
    print(f"draft phase by piece, us per proposal ({proposals} proposals, {len(record)} head calls, "
          f"{phase_ms.get('steps')} steps, {phase_ms.get('verify_steps')} verifies); exclusive times, "
          "median and mean over proposals (isolated: over replayed head call + gate)")
    print(f"  {'piece':<48} {'loop med':>9} {'loop mean':>9} {'iso med':>9} {'iso mean':>9}")
    for name in names:
        a, b = loop.get(name, (0.0, 0.0)), iso.get(name, (0.0, 0.0))
        print(f"  {name:<48} {a[0]:9.1f} {a[1]:9.1f} {b[0]:9.1f} {b[1]:9.1f}")
    steps = max(1, proposals)
    print(f"  {'draft phase (loop timer), mean':<48} {'':9} {phase_ms.get('draft', 0.0) * 1000 / steps:9.1f}")
    print("phase ms:", {k: round(v, 1) for k, v in phase_ms.items() if isinstance(v, float)})


if __name__ == "__main__":
    main()
