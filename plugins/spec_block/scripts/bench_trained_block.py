"""Acceptance and paired speed-up of a trained DFlash drafter on the embedded model.

For each prompt (the first benchmark prompt of each chosen class, plus held-out generated
prompts: never answered for a training corpus, see ``tsspec_training.prompts.is_held_out``):

* acceptance, gate open (``--spec-pmin 0``, no governor): tokens per verify and, per block row k,
  the share of proposals whose k-th token landed: what the drafter itself knows;
* speed-up over plain decoding at the chosen settings (``--pmin``; default the algorithm's own),
  PAIRED: each repetition runs plain and the drafter back to back on loaded models, order
  alternating; the figure is the median of the per-pair decode tok/s ratios;
* identical output: every speculative run is compared with plain, greedy and (``--sampled``)
  one seeded sampling run; the script exits 1 on any difference.

    python plugins/spec_block/scripts/bench_trained_block.py --drafter d.gguf --reps 3 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from importlib import resources


def prompts_for(classes: list[str], held_out: int) -> list[dict]:
    """[{id, class, messages}] : the first bench prompt of each class, then held-out ones."""
    from tsspec_training.prompts import held_out_prompts

    chosen: dict[str, dict] = {}
    text = resources.files("tsspec_bench").joinpath("data/prompts/bench.jsonl").read_text("utf-8")
    for line in filter(str.strip, text.splitlines()):
        entry = json.loads(line)
        if entry["class"] in classes:
            chosen.setdefault(entry["class"], {"id": entry["id"], "class": entry["class"],
                                               "messages": entry["messages"]})
    out = [chosen[c] for c in classes if c in chosen]
    for i, prompt in enumerate(held_out_prompts(400)[:held_out]):
        out.append({"id": f"held-out-{i + 1}", "class": "held-out", "messages": [{"role": "user", "content": prompt}]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", required=True, help="the trained dflash GGUF")
    ap.add_argument("--classes", default="chat,prose,math")
    ap.add_argument("--held-out", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--pmin", type=float, default=None, help="gate for the timed runs (default: the algorithm's)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sampled", action="store_true", help="also check one seeded sampling run per prompt")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import torch

    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime.generation import generate
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.sampling import SamplingParams

    torch.set_num_threads(args.threads)
    path = str(embedded_model_path())
    plain_opts = SpeculationOptions(enabled=False)
    bare = load_model(path, options=plain_opts)
    drafting = load_model(path, draft_model=args.drafter, options=SpeculationOptions(spec_type="block"))
    open_gate = SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False)
    timed = SpeculationOptions(spec_type="block", pmin=args.pmin)
    tok = bare.tokenizer
    rows = []
    for prompt in prompts_for(args.classes.split(","), args.held_out):
        ids = tok.encode(tok.apply_chat_template(prompt["messages"], add_generation_prompt=True),
                         add_special_tokens=False)
        n = args.max_tokens
        plain = generate(bare, list(ids), plain_opts, max_tokens=n)
        probe = generate(drafting, list(ids), open_gate, max_tokens=n)
        checks = [("open gate", probe.tokens)]
        st = probe.stats
        by_position = [c / st.drafts for c in st.accepted_per_position] if st.drafts else []
        ratios = []
        for rep in range(args.reps):
            order = ("plain", "block") if rep % 2 == 0 else ("block", "plain")
            runs = {}
            for which in order:
                if which == "plain":
                    runs[which] = generate(bare, list(ids), plain_opts, max_tokens=n)
                else:
                    runs[which] = generate(drafting, list(ids), timed, max_tokens=n)
            checks.append((f"timed rep {rep}", runs["block"].tokens))
            ratios.append(runs["block"].stats.tokens_per_second / runs["plain"].stats.tokens_per_second)
            timed_stats = runs["block"].stats
        if args.sampled:
            sampling = SamplingParams(temperature=0.7, top_k=40, seed=5)
            want = generate(bare, list(ids), plain_opts, max_tokens=n, sampling=sampling).tokens
            got = generate(drafting, list(ids), open_gate, max_tokens=n, sampling=sampling).tokens
            if got != want:
                print(f"OUTPUT DIFFERS: {prompt['id']} seeded sampling", file=sys.stderr)
                return 1
        for label, tokens in checks:
            if tokens != plain.tokens:
                print(f"OUTPUT DIFFERS: {prompt['id']} {label}", file=sys.stderr)
                return 1
        row = {
            "id": prompt["id"], "class": prompt["class"], "tokens": len(plain.tokens),
            "open_gate": {"tokens_per_verify": round(st.tokens_per_verify, 3),
                          "acceptance": round(st.acceptance_rate, 3),
                          "accept_by_position": [round(p, 3) for p in by_position]},
            "timed": {"pmin": args.pmin, "speedups": [round(r, 3) for r in ratios],
                      "speedup_median": round(statistics.median(ratios), 3),
                      "tokens_per_verify": round(timed_stats.tokens_per_verify, 3),
                      "draft_ms": round(timed_stats.phase_ms.get("draft", 0.0), 1),
                      "verify_ms": round(timed_stats.phase_ms.get("verify", 0.0), 1)},
            "identical": True,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {"drafter": args.drafter, "model": path, "reps": args.reps, "max_tokens": args.max_tokens,
               "threads": args.threads, "time": time.strftime("%Y-%m-%d %H:%M"), "results": rows}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
