"""Figures for the shipped drafters: acceptance and speed-up per prompt class, paired runs.

For each prompt (the first benchmark prompt of each chosen class, plus held-out generated
prompts that no training corpus contains) and each algorithm, runs are PAIRED with plain
decoding: every repetition runs plain then the algorithm (order alternating between reps) on
the same loaded model, checks the output is identical to plain, and records decode tok/s. The
speed-up is the median of the per-pair ratios. Acceptance: tokens per verify and, per draft
position k, the share of proposals whose k-th token landed.

Options: the speculation environment the ``tsspec`` CLI reads (``TS_SPEC_ADAPTIVE``,
``TS_SPEC_DRAFT``, ``TS_SPEC_PMIN``, ``TS_SPEC_DRAFT_MODEL`` / ``TS_SPEC_DRAFTER``, and their
``TS_MTP_*`` spellings) applies to every algorithm, as it would to ``tsspec generate``; this
script's flags win over it, as the CLI's flags do. Two CLI options are the script's own to set:
the algorithm (``--algorithms``; ``TS_SPEC_TYPE`` is ignored) and speculation being on (each
algorithm is paired with plain decoding; ``TS_SPEC=0`` is ignored).

    python plugins/drafters_smollm2/scripts/bench_drafters.py --reps 2 --markdown drafters.md
    TS_SPEC_ADAPTIVE=0 python plugins/drafters_smollm2/scripts/bench_drafters.py --algorithms draft-head
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from importlib import resources

from tsspec.errors import TsspecError
from tsspec_gguf.embedded import embedded_model_path
from tsspec.runtime.defaults import default_catalog
from tsspec.runtime.generation import generate
from tsspec.runtime.loading import load_model
from tsspec.runtime.options import SpeculationOptions
from tsspec_training.prompts import held_out_prompts


def bench_prompts(classes: list[str], held_out: int) -> list[dict]:
    rows = []
    seen = set()
    text = resources.files("tsspec_bench").joinpath("data/prompts/bench.jsonl").read_text("utf-8")
    for line in text.splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        if d["class"] in classes and d["class"] not in seen:
            seen.add(d["class"])
            rows.append({"id": d["id"], "class": d["class"], "messages": d["messages"], "max_tokens": d["max_tokens"]})
    for i, p in enumerate(held_out_prompts(400)[:held_out]):
        rows.append({"id": f"held-out-{i + 1}", "class": "held-out", "messages": [{"role": "user", "content": p}],
                     "max_tokens": 96})
    return rows


def algorithm_options(algo: str, args: argparse.Namespace, environ=None) -> SpeculationOptions:
    """The options ``tsspec generate --spec-type <algo>`` would run with under ``environ`` (default
    os.environ) and this script's flags: the flags win over the environment, --pmin / --draft
    apply to draft-head only. OptionsError for a bad value in either."""
    cli = {"enabled": True, "spec_type": algo, "adaptive": args.spec_adaptive}
    if algo == "draft-head":
        cli.update(pmin=args.pmin, draft=args.draft)
    return SpeculationOptions.resolve(cli=cli, env=os.environ if environ is None else environ)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=(
        "The CLI's speculation environment (TS_SPEC_ADAPTIVE, TS_SPEC_DRAFT, TS_SPEC_PMIN, TS_SPEC_DRAFT_MODEL...) "
        "applies to every algorithm; the flags here win over it. TS_SPEC_TYPE and TS_SPEC=0 are ignored: "
        "--algorithms names what runs, each paired with plain decoding."))
    ap.add_argument("--classes", default="chat,prose,math,qa,code-edit")
    ap.add_argument("--held-out", type=int, default=2)
    ap.add_argument("--algorithms", default="draft-head,ngram,auto")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=0, help="cap per prompt (0: the prompt's own)")
    ap.add_argument("--pmin", type=float, default=None, help="draft-head: --spec-pmin (default: the file's recommendation)")
    ap.add_argument("--draft", type=int, default=None, help="draft-head: --spec-draft (default: the file's recommendation)")
    ap.add_argument("--spec-adaptive", action=argparse.BooleanOptionalAction, default=None,
                    help="the cost governor on/off for every algorithm, as the CLI's flag (default: TS_SPEC_ADAPTIVE, else on)")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    algorithms = args.algorithms.split(",")
    try:
        options = {algo: algorithm_options(algo, args) for algo in algorithms}
        return _bench(args, algorithms, options)
    except TsspecError as exc:
        print(f"bench_drafters: error: {exc}", file=sys.stderr)
        return 2


def _bench(args: argparse.Namespace, algorithms: list[str], options: dict[str, SpeculationOptions]) -> int:
    path = str(embedded_model_path())
    catalog = default_catalog()
    # the bundled drafter (or the environment's drafter file) attaches for draft-head; `auto`
    # gets what the registration says
    with_drafter = load_model(path, catalog=catalog, options=algorithm_options("draft-head", args))
    head = getattr(with_drafter, "draft_head", None)
    auto_target = load_model(path, catalog=catalog, options=algorithm_options("auto", args))
    bare = load_model(path, catalog=catalog, options=SpeculationOptions(enabled=False))
    results = []
    for prompt in bench_prompts(args.classes.split(","), args.held_out):
        tok = bare.tokenizer
        ids = tok.encode(tok.apply_chat_template(prompt["messages"], add_generation_prompt=True), add_special_tokens=False)
        n = min(prompt["max_tokens"], args.max_tokens) if args.max_tokens else prompt["max_tokens"]
        for algo in algorithms:
            target = {"draft-head": with_drafter, "auto": auto_target}.get(algo, bare)
            opts = options[algo]
            ratios, tpv, per_pos, accepted, drafts = [], [], None, 0, 0
            for rep in range(args.reps):
                order = ["plain", algo] if rep % 2 == 0 else [algo, "plain"]
                runs = {}
                for which in order:
                    if which == "plain":
                        runs["plain"] = generate(bare, list(ids), SpeculationOptions(enabled=False), max_tokens=n)
                    else:
                        runs["spec"] = generate(target, list(ids), opts, max_tokens=n, registry=catalog.speculators)
                plain, spec = runs["plain"], runs["spec"]
                if spec.tokens != plain.tokens:
                    print(f"OUTPUT DIFFERS: {prompt['id']} {algo}", file=sys.stderr)
                    return 1
                ratios.append(spec.stats.tokens_per_second / plain.stats.tokens_per_second)
                st = spec.stats
                tpv.append(st.tokens_per_verify)
                per_pos = [c / st.drafts for c in st.accepted_per_position] if st.drafts else []
                accepted, drafts = st.accepted_tokens, st.draft_tokens
                resolved = spec.speculator or algo
            row = {"id": prompt["id"], "class": prompt["class"], "algorithm": algo, "resolved": str(resolved),
                   "tokens": len(plain.tokens), "speedup_median": statistics.median(ratios), "speedups": ratios,
                   "tokens_per_verify": statistics.median(tpv), "accept_by_position": per_pos,
                   "acceptance": accepted / drafts if drafts else 0.0}
            results.append(row)
            print(json.dumps(row), flush=True)
    out = {"model": path, "drafter": getattr(head, "source", None), "reps": args.reps,
           "pmin": args.pmin, "draft": args.draft, "argv": sys.argv[1:],
           "options": {a: {"adaptive": o.adaptive, "draft": o.draft, "pmin": o.pmin} for a, o in options.items()},
           "time": time.strftime("%Y-%m-%d %H:%M"), "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.markdown:
        lines = ["| prompt | class | algorithm | tokens | speed-up (median) | tokens/verify | acceptance | accept at 1..k |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in results:
            pos = " ".join(f"{p:.2f}" for p in r["accept_by_position"][:6])
            lines.append(f"| {r['id']} | {r['class']} | {r['algorithm']} | {r['tokens']} | {r['speedup_median']:.2f}x | "
                         f"{r['tokens_per_verify']:.2f} | {r['acceptance']:.2f} | {pos} |")
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
