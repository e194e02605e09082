"""Paired A/B: the NextN head on the compiled kernels (native) against the torch module.

Loads the embedded model with its shipped MTP drafter once, then for each prompt and rep runs
the same generation twice in alternating order (A then B, then B then A on the next rep), the
head switched between engines with ``NextNFileHead.use_native`` (what ``TS_MTP_NATIVE=0``
selects at load time). Prints per engine the median draft-phase milliseconds per step and per
head call (the draft phase is every head call plus the gate), the median CPU milliseconds of
the calling thread per proposal (``time.thread_time``: what a proposal costs in work, whatever
else holds the cores; complete only when the kernels run on that one thread, ``--threads 1``),
tokens per second, and the median of the per-pair ratios torch / native; checks both engines
emit the same tokens (they must: verification decides; only the drafts may differ).

    python plugins/spec_draft_head/scripts/bench_native_head.py --reps 3 --max-tokens 96 --draft 1
"""

from __future__ import annotations

import argparse
import statistics
import time

PROMPTS = {
    "chat": "Explain photosynthesis to a child in a few sentences.",
    "math": "A train travels 120 km in 1.5 hours. What is its average speed? Show the steps.",
    "prose": "Write a short paragraph about an old lighthouse keeper and the sea.",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--draft", type=int, default=1, help="--spec-draft (fixed window, no governor)")
    ap.add_argument("--pmin", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=0, help="kernel threads of the native head (0: torch's)")
    args = ap.parse_args()

    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime.generation import generate
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions

    target = load_model(embedded_model_path(), options=SpeculationOptions(spec_type="draft-head"))
    head = target.draft_head
    if head is None or not hasattr(head, "use_native"):
        raise SystemExit("no NextN drafter attached: is tsspec-drafters-smollm2 installed?")
    if not head.use_native(True):
        raise SystemExit("the compiled kernels are not available: nothing to compare")
    tok = target.tokenizer
    from tsspec_draft_head.speculator import DraftHeadSpeculator

    cpu_ms: list[float] = []  # per proposal, the calling thread's CPU time
    propose = DraftHeadSpeculator.propose

    def timed_propose(self, ctx):
        t0 = time.thread_time_ns()
        try:
            return propose(self, ctx)
        finally:
            cpu_ms.append((time.thread_time_ns() - t0) / 1e6)

    DraftHeadSpeculator.propose = timed_propose
    options = SpeculationOptions(spec_type="draft-head", adaptive=False, pmin=args.pmin, draft=args.draft)

    def run(prompt: str, native: bool) -> dict:
        head.use_native(native)
        if native and args.threads:
            head._native.threads = args.threads
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]), add_special_tokens=False)
        calls = head.counts.calls
        cpu_ms.clear()
        gen = generate(target, list(ids), options, max_tokens=args.max_tokens)
        s = gen.stats
        draft_ms = s.phase_ms["draft"]
        head_calls = head.counts.calls - calls
        return {"tokens": list(gen.tokens), "draft_ms_step": draft_ms / max(1, s.drafts),
                "draft_ms_call": draft_ms / max(1, head_calls),
                "cpu_ms_proposal": statistics.median(cpu_ms) if cpu_ms else float("nan"),
                "tok_s": s.emitted_tokens / (s.wall_ms / 1000.0),
                "accept": s.accepted_tokens / max(1, s.draft_tokens)}

    run(PROMPTS["chat"], True)  # warm both engines (tables, caches, the pool)
    run(PROMPTS["chat"], False)
    rows: dict[str, dict[bool, list[dict]]] = {}
    for rep in range(args.reps):
        for name, prompt in PROMPTS.items():
            order = (False, True) if rep % 2 == 0 else (True, False)
            pair = {native: run(prompt, native) for native in order}
            if pair[True]["tokens"] != pair[False]["tokens"]:
                raise SystemExit(f"{name}: the engines emitted different tokens (a bug: verification decides)")
            for native, r in pair.items():
                rows.setdefault(name, {}).setdefault(native, []).append(r)

    med = statistics.median
    print(f"draft-head, --spec-draft {args.draft} --spec-pmin {args.pmin}, {args.max_tokens} tokens, "
          f"{args.reps} paired reps (alternating order); medians")
    print(f"{'class':<6} {'engine':<7} {'ms/step':>8} {'ms/call':>8} {'cpu ms':>7} {'tok/s':>7} {'accept':>7}"
          "   torch/native ms/step, cpu ms")
    all_ratios, all_cpu = [], []
    for name, by in rows.items():
        ratios = [t["draft_ms_step"] / n["draft_ms_step"] for t, n in zip(by[False], by[True])]
        cpu = [t["cpu_ms_proposal"] / n["cpu_ms_proposal"] for t, n in zip(by[False], by[True])]
        all_ratios += ratios
        all_cpu += cpu
        for native in (False, True):
            rs = by[native]
            print(f"{name:<6} {'native' if native else 'torch':<7} {med(r['draft_ms_step'] for r in rs):8.2f} "
                  f"{med(r['draft_ms_call'] for r in rs):8.2f} {med(r['cpu_ms_proposal'] for r in rs):7.2f} "
                  f"{med(r['tok_s'] for r in rs):7.1f} {med(r['accept'] for r in rs):7.2f}"
                  + (f"   {med(ratios):.2f}x, {med(cpu):.2f}x" if native else ""))
    print(f"all classes, median of {len(all_ratios)} pairs: torch/native draft ms per step {med(all_ratios):.2f}x, "
          f"CPU ms per proposal {med(all_cpu):.2f}x")


if __name__ == "__main__":
    main()
