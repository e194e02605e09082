"""How well a DFlash drafter's confidences predict what lands, on the embedded model.

For each benchmark prompt of the chosen classes, one greedy run with the gate open (``pmin 0``,
no governor, every block row proposed) records, per proposal, the drafter's confidences (the
softmax at each row's argmax) and how many drafts landed. It prints, by confidence bucket:

* row 1: how often it landed (proposals whose first confidence fell in the bucket);
* row k > 1 given rows 1..k-1 landed, bucketed by its own confidence;
* the whole chain: how often rows 1..k all landed, bucketed by the cumulative product of
  confidences 1..k (what the block gate reads).

    python plugins/spec_block/scripts/confidence_calibration.py --per-class 2 --max-tokens 96
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources

EDGES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def bucket(value: float) -> int:
    return sum(value >= edge for edge in EDGES)


def label(b: int) -> str:
    lo = 0.0 if b == 0 else EDGES[b - 1]
    hi = 1.0 if b == len(EDGES) else EDGES[b]
    return f"[{lo:.1f},{hi:.1f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default=None, help="a dflash GGUF (default: the shipped SmolLM2 drafter)")
    ap.add_argument("--classes", default="chat,prose,math,qa,code-edit,rewrite,summary,rag")
    ap.add_argument("--per-class", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the raw (confidences, landed) records here")
    args = ap.parse_args(argv)

    import torch

    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime.generation import generate
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions

    from tsspec_block.speculator import make_block_speculator

    torch.set_num_threads(args.threads)
    drafter = args.drafter
    if drafter is None:
        import tsspec_drafters_smollm2

        drafter = str(tsspec_drafters_smollm2.HERE / "smollm2-135m-instruct-dflash.gguf")
    path = str(embedded_model_path())
    target = load_model(path, draft_model=drafter, options=SpeculationOptions(spec_type="block"))
    bare = load_model(path, options=SpeculationOptions(enabled=False))
    options = SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False)
    classes = args.classes.split(",")
    counts: dict[str, int] = {}
    prompts = []
    text = resources.files("tsspec_bench").joinpath("data/prompts/bench.jsonl").read_text("utf-8")
    for line in filter(str.strip, text.splitlines()):
        entry = json.loads(line)
        if entry["class"] in classes and counts.get(entry["class"], 0) < args.per_class:
            counts[entry["class"]] = counts.get(entry["class"], 0) + 1
            prompts.append(entry)
    tok = target.tokenizer
    records = []  # (class, confidences, landed)
    for entry in prompts:
        ids = tok.encode(tok.apply_chat_template(entry["messages"], add_generation_prompt=True),
                         add_special_tokens=False)
        spec = make_block_speculator(target, options)
        head = spec.head
        seen: list[list[float]] = []
        draft_block = head.draft_block

        def recording(*a, **k):
            tokens, conf = draft_block(*a, **k)
            seen.append([float(c) for c in conf])
            return tokens, conf

        head.draft_block = recording
        landed: list[int] = []
        commit = spec.commit

        def counting(tokens, rows, start):
            if len(landed) < len(seen) and start > 0:
                landed.append(len(tokens) - 1)
            return commit(tokens, rows, start)

        spec.commit = counting
        gen = generate(target, list(ids), options, max_tokens=args.max_tokens, speculator=spec)
        plain = generate(bare, list(ids), SpeculationOptions(enabled=False), max_tokens=args.max_tokens)
        if gen.tokens != plain.tokens:
            print(f"OUTPUT DIFFERS: {entry['id']}", file=sys.stderr)
            return 1
        for conf, n in zip(seen, landed):
            records.append((entry["class"], conf, n))
        print(f"{entry['id']}: {len(seen)} proposals, {sum(landed)} landed, tokens/verify "
              f"{gen.stats.tokens_per_verify:.2f}", flush=True)
    rows = max(len(c) for _, c, _ in records)
    first = [[0, 0] for _ in range(len(EDGES) + 1)]
    later = [[0, 0] for _ in range(len(EDGES) + 1)]
    chain = [[0, 0] for _ in range(len(EDGES) + 1)]
    for _, conf, n in records:
        product = 1.0
        for i, c in enumerate(conf):
            product *= c
            table = first if i == 0 else later
            if i <= n:  # reached: every row before it landed
                table[bucket(c)][0] += 1
                table[bucket(c)][1] += int(i < n)
            chain[bucket(product)][0] += 1
            chain[bucket(product)][1] += int(i < n)
    print(f"{len(records)} proposals, {rows} rows each")
    print("bucket      row1 n  landed | row>1 n landed | chain n landed")
    for b in range(len(EDGES) + 1):
        cells = []
        for table in (first, later, chain):
            n, k = table[b]
            cells.append(f"{n:6d} {k / n:6.2f}" if n else f"{n:6d}    -  ")
        print(f"{label(b):10s} " + " | ".join(cells))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([{"class": c, "confidences": conf, "landed": n} for c, conf, n in records], handle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
