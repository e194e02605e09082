"""What a plain decode token costs on the embedded model, and how much of it is outside the
forward: ``tsspec.generate`` with speculation off on the bench's prompts (one or more a class),
the way the bench's plain runs and ``tsspec generate --spec-type none`` call it.

Per run it records the decode time per token (``SpecStats.decode_ms`` over the tokens after the
first), and inside it the time in ``spec_forward`` (the model's step), in ``Sampler.sample`` and,
with ``--stream``, in the per-token text callback the CLI passes (detokenisation, stop strings);
"loop" is the rest (the execution's bookkeeping: stats, governor, stop checks). Prints one JSON
line: microseconds per token, medians over the runs, and the runs' decode tok/s.

    python plugins/model_llama/scripts/plain_decode.py [--per-class 1] [--reps 3] [--tokens 128]
        [--stream] [--threads 2]

Timing wrappers add ~1 us a call. To compare two builds, run it alternately under each build's
interpreter path (the figures in docs/figures.md pair two checkouts this way).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> int:
    from tsspec.bench.prompts import encode_case, load_prompt_set, select_cases
    from tsspec.modeling.embedded import embedded_model_path
    from tsspec.runtime import generation
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.sampling import Sampler
    from tsspec_model_llama import load_llama

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128, help="at most this many tokens a run")
    ap.add_argument("--stream", action="store_true", help="pass a per-token text callback, as the CLI does")
    ap.add_argument("--threads", type=int, default=2)
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

    forward = timed("forward", target.spec_forward)
    prefill = target.spec_forward
    target.spec_forward = lambda tokens, **k: forward(tokens, **k) if len(tokens) == 1 else prefill(tokens, **k)
    Sampler.sample = timed("sample", Sampler.sample)
    sink = timed("stream", lambda tok, piece: None)
    generation.generate(target, list(cases[0].prompt_ids), SpeculationOptions(enabled=False), max_tokens=8)  # warm up
    per_token: dict[str, list[float]] = {k: [] for k in ("decode", "forward", "sample", "stream", "loop", "tok_s")}
    for _ in range(args.reps):
        for case in cases:
            for k in spent:
                spent[k] = 0
            result = generation.generate(
                target, list(case.prompt_ids), SpeculationOptions(enabled=False),
                max_tokens=min(args.tokens, case.max_tokens), on_token=sink if args.stream else None,
            )
            stats = result.stats
            steps = stats.plain_steps  # the decode steps (the prefill made the first token)
            if steps < 1:
                continue
            # forwards: the one-row steps only (the prefill is outside decode_ms); the first
            # sample and callback follow the prefill, so each of those counts as one of steps + 1
            row = {
                "decode": stats.decode_ms * 1e3 / steps,
                "forward": spent["forward"] / 1e3 / steps,
                "sample": spent["sample"] / 1e3 / (steps + 1),
                "stream": spent["stream"] / 1e3 / (steps + 1),
            }
            row["loop"] = row["decode"] - row["forward"] - row["sample"] - row["stream"]
            row["tok_s"] = stats.tokens_per_second
            for k, v in row.items():
                per_token[k].append(v)
    summary = {k: round(statistics.median(v), 1) for k, v in per_token.items() if v}
    summary["runs"] = len(per_token["decode"])
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
