"""Fidelity of the block kernel's int8 arithmetic against its exact float32 arithmetic.

On the embedded model, over the lossless study's prompts (the shipped benchmark set plus its
free-form prompts): greedy-decode ``--tokens`` tokens with the float32 path, then run the prompt
and that continuation through both paths with every row's logits (teacher forcing) and report

* the max relative logit error per row, |int8 - float32|_max / |float32|_max (max and median),
  over the rows that predict the generated tokens;
* greedy-token agreement: rows whose argmax is the same on both paths;
* the free-running common prefix: leading tokens int8 greedy decoding shares with float32's.

    python scripts/precision_study.py [--tokens 48] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import tsspec
from tsspec_bench.prompts import encode_case, load_prompt_set
from tsspec_gguf.embedded import embedded_model_path

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from lossless_study import EXTRA_PROMPTS  # noqa: E402  (the same prompts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    path = embedded_model_path()
    exact = tsspec.load_model(path, dtype="float32-blocks")
    fast = tsspec.load_model(path, dtype="int8")
    tok = exact.tokenizer
    prompts = [encode_case(exact, c).prompt_ids for c in load_prompt_set()]
    prompts += [tuple(tok.encode(p)) for p in EXTRA_PROMPTS]
    plain = tsspec.SpeculationOptions(enabled=False)
    rows_err, agree, total, prefixes, out = [], 0, 0, [], []
    for i, ids in enumerate(prompts):
        ref = tsspec.generate(exact, list(ids), plain, max_tokens=args.tokens).tokens
        mine = tsspec.generate(fast, list(ids), plain, max_tokens=args.tokens).tokens
        prefix = next((k for k, (a, b) in enumerate(zip(ref, mine)) if a != b), min(len(ref), len(mine)))
        logits = []
        for target in (exact, fast):  # the rows that predict each generated token
            target.reset()
            last, _ = target.spec_forward(list(ids), all_logits_rows=False, want_hidden=False)
            rest, _ = target.spec_forward(list(ref[:-1]), all_logits_rows=True, want_hidden=False)
            logits.append(torch.cat([last, rest]))
            target.reset()
        a, b = logits  # [generated, vocab]
        rel = ((b - a).abs().amax(dim=1) / a.abs().amax(dim=1)).tolist()
        same = (a.argmax(dim=1) == b.argmax(dim=1)).sum().item()
        n = len(ref)
        rows_err += rel
        agree += same
        total += n
        prefixes.append(prefix / max(1, len(ref)))
        out.append({"prompt": i, "max_rel_logit_error": max(rel), "agreement": same / max(1, n),
                    "free_running_prefix": prefix, "tokens": len(ref)})
        print(f"prompt {i:2d}: max rel logit error {max(rel):.2e}, argmax agreement {same}/{n}, "
              f"free-running common prefix {prefix}/{len(ref)}", flush=True)
    summary = {
        "prompts": len(prompts), "tokens": args.tokens,
        "max_rel_logit_error": max(rows_err), "median_rel_logit_error": statistics.median(rows_err),
        "greedy_agreement": agree / total, "free_running_prefix_median": statistics.median(prefixes),
        "free_running_identical": sum(p == 1.0 for p in prefixes),
    }
    print(f"\n{len(prompts)} prompts, {args.tokens} tokens: max relative logit error {summary['max_rel_logit_error']:.2e} "
          f"(median {summary['median_rel_logit_error']:.2e}); teacher-forced greedy agreement {agree}/{total} "
          f"({100 * summary['greedy_agreement']:.1f}%); free-running outputs identical in "
          f"{summary['free_running_identical']}/{len(prompts)} (median common prefix {100 * summary['free_running_prefix_median']:.0f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "prompts": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
