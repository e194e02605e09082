"""Generate (or extend) the on-policy answer cache the EAGLE-3 head trains on.

    python plugins/drafters_smollm2/scripts/onpolicy_data.py --prompts 2400 --modes greedy,sample-1 \
        --cache ~/.cache/tsspec/onpolicy-v1 [--rate-check 6]

The embedded model answers the seeded prompt mix (``tsspec_training.onpolicy.prompt_mix``) on its
batched paged path; every finished answer is appended to the cache, so the run can be stopped and
resumed. The answers' feature rows (the target's low, middle and high layer residuals,
``feature_layers``) are kept in shards beside the index. ``--rate-check N`` first times N prompts answered one at a time and N batched (greedy,
nothing cached) and prints both rates. ``--chunk N`` answers only the next N prompts of the mix
not yet cached (every mode), so a long extension runs as short, separately scheduled chunks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2400)
    ap.add_argument("--modes", default="greedy,sample-1")
    ap.add_argument("--cache", default=str(Path.home() / ".cache/tsspec/onpolicy-v1"))
    ap.add_argument("--no-features", action="store_true", help="answers only (no tapped feature rows)")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rate-check", type=int, default=0)
    ap.add_argument("--model", default=None)
    ap.add_argument("--chunk", type=int, default=0, help="answer only the next N uncached prompts, then stop")
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from tsspec.runtime.defaults import default_catalog
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.named_models import default_model, resolve_model_path
    from tsspec.runtime.options import SpeculationOptions
    from tsspec_training.onpolicy import _key, answer_rate, feature_layers, onpolicy_answers, prompt_mix, read_cache

    catalog = default_catalog()
    model = args.model or str(resolve_model_path(default_model(catalog), catalog))
    target = load_model(model, catalog=catalog, options=SpeculationOptions(enabled=False))
    mix = prompt_mix(args.prompts, args.seed)
    modes = args.modes.split(",")
    if args.chunk:
        done = {_key(r) for r in read_cache(Path(args.cache).expanduser() / "answers.jsonl")}
        mix = [rec for rec in mix if any(_key(dict(rec, mode=m)) not in done for m in modes)][: args.chunk]
        if not mix:
            print(json.dumps({"records": 0, "note": "every prompt of the mix is cached"}), flush=True)
            return 0

    def log(line: str) -> None:
        print(line, flush=True)

    if args.rate_check:
        sample = mix[: args.rate_check]
        one = answer_rate(target, sample, max_new_tokens=args.max_new, batch=1)
        many = answer_rate(target, sample, max_new_tokens=args.max_new, batch=args.rate_check)
        log(json.dumps({"rate_check_prompts": len(sample), "one_at_a_time_tok_s": round(one, 1),
                        f"batched_{args.rate_check}_tok_s": round(many, 1)}))
    recs = onpolicy_answers(target, mix, Path(args.cache).expanduser(), modes=modes,
                            max_new_tokens=args.max_new, batch=args.batch, log=log,
                            taps=None if args.no_features else feature_layers(int(target.config.num_layers)))
    log(json.dumps({"records": len(recs), "answer_tokens": sum(len(r["answer_ids"]) for r in recs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
