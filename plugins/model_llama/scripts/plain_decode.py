"""What a plain decode token costs on the embedded model, and how much of it is outside the
forward: ``tsspec.generate`` with speculation off on the bench's prompts (one or more a class),
the way the bench's plain runs and ``tsspec generate --spec-type none`` call it.

Per run it records the decode time per token (``SpecStats.decode_ms`` over the tokens after the
first), and inside it the time in ``spec_forward`` (the model's one-row steps), in
``Sampler.sample`` and, with ``--stream``, in the per-token text callback the CLI passes
(detokenisation, stop strings); "loop" is the rest (the execution's bookkeeping). Prints one
JSON line: microseconds per token, medians over the runs, and the runs' decode tok/s.

    python plugins/model_llama/scripts/plain_decode.py [--per-class 1] [--reps 3] [--tokens 128]
        [--stream] [--threads 2] [--pair glue]

``--pair glue`` alternates two sides run by run in this process (the order swapped every
round) and prints both sides' medians and B/A as the ratio of medians and the median of the
paired ratios: A is the step as it ran before the one-call step (``native_step = False``: the
embedding, final norm and LM head called from Python), torch's argmax for a greedy draw and the
cost governor on without a speculator; B is the default. ``--pair native_step`` flips only the
first of those. Timing wrappers add ~1 us a call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

PIECES = ("decode", "forward", "sample", "stream", "loop", "tok_s")


def main() -> int:
    from tsspec_bench.prompts import encode_case, load_prompt_set, select_cases
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime import generation, sampling, text_stream
    from tsspec.runtime.governor import SpeculationCostGovernor
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.sampling import Sampler
    from tsspec_model_llama import load_llama

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128, help="at most this many tokens a run")
    ap.add_argument("--stream", action="store_true", help="pass a per-token text callback, as the CLI does")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pair", choices=("glue", "native_step"), default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_llama(embedded_model_path())
    cases = [encode_case(target, c) for c in select_cases(load_prompt_set(), None, args.per_class)]
    spent = {"forward": 0, "sample": 0, "stream": 0}

    def timed(name, fn):
        def wrapper(*a, **k):
            start = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter_ns() - start
        return wrapper

    forward, prefill = timed("forward", target.spec_forward), target.spec_forward
    target.spec_forward = lambda tokens, **k: forward(tokens, **k) if len(tokens) == 1 else prefill(tokens, **k)
    Sampler.sample = timed("sample", Sampler.sample)
    text_stream.TextStream.push = timed("stream", text_stream.TextStream.push)
    numpy_argmax = sampling.greedy_token

    def torch_argmax(logits):
        return int(torch.argmax(logits).item())

    def side(name: str):
        """Set up side A (the step before) or B (the default); returns generate's governor."""
        before = name == "A"
        target.native_step = not before
        if args.pair == "glue":
            sampling.greedy_token = torch_argmax if before else numpy_argmax
            return SpeculationCostGovernor(enabled=True) if before else None
        return None

    def run(case, governor) -> dict[str, float] | None:
        for k in spent:
            spent[k] = 0
        result = generation.generate(
            target, list(case.prompt_ids), SpeculationOptions(enabled=False), governor=governor,
            max_tokens=min(args.tokens, case.max_tokens), on_token=(lambda tok, piece: None) if args.stream else None,
        )
        stats, steps = result.stats, result.stats.plain_steps  # decode steps (the prefill made the first token)
        if steps < 1:
            return None
        # forwards: the one-row steps only (the prefill is outside decode_ms); the first sample
        # and text piece follow the prefill, so each of those counts as one of steps + 1
        row = {
            "decode": stats.decode_ms * 1e3 / steps,
            "forward": spent["forward"] / 1e3 / steps,
            "sample": spent["sample"] / 1e3 / (steps + 1),
            "stream": spent["stream"] / 1e3 / (steps + 1),
        }
        row["loop"] = row["decode"] - row["forward"] - row["sample"] - row["stream"]
        row["tok_s"] = stats.tokens_per_second
        return row

    generation.generate(target, list(cases[0].prompt_ids), SpeculationOptions(enabled=False), max_tokens=8)  # warm up
    sides = ("A", "B") if args.pair else ("B",)
    got: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for rnd in range(args.reps):
        for case in cases:
            for name in sides if rnd % 2 == 0 else sides[::-1]:
                row = run(case, side(name))
                if row is not None:
                    got[name].append(row)
    side("B")

    def medians(rows):
        return {k: round(statistics.median(r[k] for r in rows), 1) for k in PIECES}

    if not args.pair:
        print(json.dumps({**medians(got["B"]), "runs": len(got["B"])}))
        return 0
    a, b = medians(got["A"]), medians(got["B"])
    print(f"{args.pair}: {len(got['A'])} runs a side; us per token (medians); B/A as ratio of medians (median of paired ratios)")
    for k in PIECES:
        paired = [y[k] / x[k] for x, y in zip(got["A"], got["B"]) if x[k]]
        ratio = f"{b[k] / a[k]:.3f} ({statistics.median(paired):.3f})" if a[k] and paired else "-"
        print(f"{k:8s} A {a[k]:10.1f}  B {b[k]:10.1f}  B/A {ratio}")
    print(json.dumps({"A": a, "B": b}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
