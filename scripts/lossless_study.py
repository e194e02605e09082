"""Tie-aware losslessness of n-gram speculation on the embedded model (a study).

For every prompt of the shipped benchmark set plus a few short free-form ones (>= 20 in all),
greedy and seeded sampling: plain decoding and ngram speculation on the same loaded model. The
outputs must be identical, or differ first at a float tie (the plain top-2 logit gap, recomputed
over the common prefix, below 1e-3): a multi-row verify is not bit-identical to a one-row step on
CPU. Prints the identical rate and every divergence with its gap; exits 1 on a real mismatch.

    python scripts/lossless_study.py [--tokens 48] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import tsspec
from tsspec_bench.lossless import check_lossless
from tsspec_bench.prompts import encode_case, load_prompt_set
from tsspec_gguf.embedded import embedded_model_path

EXTRA_PROMPTS = [
    "The history of the printing press begins",
    "def fibonacci(n):",
    "Here is a list of five fruits: apple, banana,",
    "Question: What is 17 times 3?\nAnswer:",
    "Once upon a time, in a village by the sea,",
    "import numpy as np\n\n# compute the mean of each column\n",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    target = tsspec.load_model(embedded_model_path())
    tok = target.tokenizer
    prompts = [encode_case(target, c).prompt_ids for c in load_prompt_set()]
    prompts += [tuple(tok.encode(p)) for p in EXTRA_PROMPTS]
    samplings = {"greedy": tsspec.SamplingParams(), "sampled": tsspec.SamplingParams(temperature=0.8, top_p=0.95, seed=7)}
    plain_opts = tsspec.SpeculationOptions(enabled=False)
    spec_opts = tsspec.SpeculationOptions(spec_type="ngram", adaptive=False)  # always draft: the hardest case
    rows, identical, ties, mismatches = [], 0, 0, 0
    for i, ids in enumerate(prompts):
        for mode, sampling in samplings.items():
            plain = tsspec.generate(target, list(ids), plain_opts, max_tokens=args.tokens, sampling=sampling)
            spec = tsspec.generate(target, list(ids), spec_opts, max_tokens=args.tokens, sampling=sampling)
            verdict = check_lossless(target, ids, plain.tokens, spec.tokens, sampling)
            identical += verdict.status == "identical"
            ties += verdict.status == "tie"
            mismatches += verdict.status == "mismatch"
            rows.append({"prompt": i, "mode": mode, "accepted": spec.stats.accepted_tokens,
                         "drafted": spec.stats.draft_tokens, **verdict.to_json()})
            gap = "" if verdict.top2_gap is None else f" top-2 gap {verdict.top2_gap:.2e}"
            print(f"prompt {i:2d} {mode:7s} {verdict.status:9s} accepted {spec.stats.accepted_tokens}/{spec.stats.draft_tokens}{gap}", flush=True)
    total = len(rows)
    print(f"\n{total} runs over {len(prompts)} prompts x {len(samplings)} sampling modes, {args.tokens} tokens each: "
          f"identical {identical}/{total} ({identical / total:.0%}), float ties {ties}, real mismatches {mismatches}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"runs": rows, "identical": identical, "ties": ties, "mismatches": mismatches}, fh, indent=2)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
