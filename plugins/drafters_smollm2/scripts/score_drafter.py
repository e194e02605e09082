"""Score MTP drafter files of the embedded model side by side: what a retrain changed.

For each drafter file:

* teacher-forced accuracy on the ANSWER tokens of the held-out prompts (the trainer's
  ``answer_accuracy``: step 1 and step 2 of the chain), read from the training cache that
  ``make drafters-mtp`` fills (the held-out teacher data is made there when missing);
* calibration: the same first drafts grouped by the gate's confidence (the head's top-1
  probability over its top-10 draft-vocabulary logits, ``confidence.top1_over_topk``), each
  bucket's share of the tokens and the share of its drafts that are the target's token;
* first drafts that land in real generation with the governor off: ``tsspec generate --chat
  --max-tokens 96 --spec-type draft-head --no-spec-adaptive --spec-pmin 0 --spec-draft 1`` on
  four fixed prompts (two of them held out), accepted / drafted per prompt and in
  all (deterministic: greedy, one draft a step).

    python plugins/drafters_smollm2/scripts/score_drafter.py FILE.gguf [FILE2.gguf ...] [--json OUT]

The data flags must be the ones the files were trained with (defaults: the Makefile's
``drafters-mtp`` recipe); a cache without the held-out data builds it first (minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from tsspec.errors import TsspecError

PROMPTS = [  # (label, text or held-out index)
    ("photosynthesis", "Explain photosynthesis to a child in a few sentences."),
    ("held-out-1", 0),
    ("held-out-2", 1),
    ("lighthouse", "Write a short story about a lighthouse keeper."),
]
BUCKETS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0001)  # gate confidence edges (top-1 over the top-10)
GATES = (0.3, 0.5, 0.7)  # --spec-pmin values whose pass / land shares are reported


def first_drafts(module, batches, data) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate confidence [n], landed [n]) of the head's first draft at every held-out answer token
    (teacher-forced, the head's context from the sequence's start)."""
    from tsspec_draft_head.confidence import GATE_TOP_K

    confs, hits = [], []
    with torch.no_grad():
        for seq in data:
            start = seq.answer_start
            if start < 1 or start >= len(seq.tokens):
                continue
            batch = batches.make([seq])
            labels = batch["labels"][0, start:]  # [n] draft rows or IGNORE (a miss)
            out = module.unrolled(batch["emb"], batch["hidden"], 1)[0]
            logits = module.logits(out[0, start:]).double()  # [n, K] draft-vocabulary logits
            top = torch.topk(logits, min(GATE_TOP_K, logits.shape[-1]), dim=-1).values  # [n, 10]
            confs.append(torch.softmax(top, dim=-1)[:, 0])
            hits.append(logits.argmax(-1) == labels)
    return torch.cat(confs), torch.cat(hits)


def calibration(conf: torch.Tensor, hit: torch.Tensor, *, edges=BUCKETS) -> list[dict]:
    """First drafts by gate confidence: per bucket [lo, hi) the share of all answer tokens it
    holds and the share of its drafts that land."""
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (conf >= lo) & (conf < hi)
        n = int(inside.sum())
        rows.append({"bucket": f"{lo:.1f}-{min(hi, 1.0):.1f}", "share": n / max(1, conf.numel()),
                     "lands": float(hit[inside].float().mean()) if n else None, "tokens": n})
    return rows


def at_gates(conf: torch.Tensor, hit: torch.Tensor, gates=GATES) -> list[dict]:
    """What a gate at each ``--spec-pmin`` does with these first drafts: the share of tokens
    whose draft passes, the share of passed drafts that land, and landed drafts per token
    (pass x land: what the gate's per-step decision earns)."""
    rows = []
    for p in gates:
        passed = conf >= p
        n = int(passed.sum())
        rows.append({"pmin": p, "passes": n / max(1, conf.numel()),
                     "lands": float(hit[passed].float().mean()) if n else None,
                     "landed_per_token": int((hit & passed).sum()) / max(1, conf.numel())})
    return rows


def landing(path: str, drafter: str) -> dict:
    """Accepted / drafted first drafts per prompt (governor off, chain 1, gate 0)."""
    from tsspec.runtime.defaults import default_catalog
    from tsspec.runtime.generation import generate
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions
    from tsspec_training.prompts import held_out_prompts

    catalog = default_catalog()
    opts = SpeculationOptions(enabled=True, spec_type="draft-head", adaptive=False, pmin=0.0, draft=1)
    target = load_model(path, catalog=catalog, draft_model=drafter, options=opts)
    held = held_out_prompts(400)
    out = {}
    for label, prompt in PROMPTS:
        text = held[prompt] if isinstance(prompt, int) else prompt
        gen = generate(target, text, opts, max_tokens=96, chat=True, registry=catalog.speculators)
        out[label] = (gen.stats.accepted_tokens, gen.stats.draft_tokens)
    out["all"] = tuple(sum(v[i] for v in list(out.values())) for i in (0, 1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/tsspec/training-v2"))
    ap.add_argument("--prompts", type=int, default=440)
    ap.add_argument("--answer-tokens", type=int, default=160)
    ap.add_argument("--corpus-chars", type=int, default=260_000)
    ap.add_argument("--package-chars", type=int, default=160_000)
    ap.add_argument("--held-out-prompts", type=int, default=24)
    ap.add_argument("--no-generation", action="store_true", help="teacher-forced figures only")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        return _score(args)
    except TsspecError as exc:
        print(f"score_drafter: error: {exc}", file=sys.stderr)
        return 2


def _score(args) -> int:
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec_gguf.identity import identify
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions
    from tsspec_training import dataset as datasets
    from tsspec_draft_head.nextn_file import read_nextn
    from tsspec_draft_head.speculator import DEFAULT_CATCH_UP_ROWS
    from tsspec_draft_head.trainer import _Batches, answer_accuracy

    path = str(embedded_model_path())
    target = load_model(path, options=SpeculationOptions(enabled=False))
    ident = identify(path).to_json()
    spec = datasets.DataSpec(stdlib_chars=args.corpus_chars, package_chars=args.package_chars, prompts=args.prompts,
                             answer_tokens=args.answer_tokens, soft_k=8, seed=0, cache_dir=args.cache_dir)
    held = datasets.build_held_out(target, ident.get("sha256") or ident.get("shape_digest", ""), spec,
                                   args.held_out_prompts)
    V = int(target.config.vocab_size)
    with torch.inference_mode():
        embed = target.embed(list(range(V))).float().clone()  # [V, H]
    results, first = [], None
    for file in args.files:
        module, _, manifest = read_nextn(file)
        module = module.float().eval()
        batches = _Batches(held, embed, module.draft_ids, V, 1, torch.device("cpu"))
        row = {"file": file, "recipe": {k: manifest.get("recipe", {}).get(k) for k in ("steps", "lr", "unroll", "kl_weight")},
               "answers": answer_accuracy(module, batches, held, 2),
               "answers_served": answer_accuracy(module, batches, held, 2, context_rows=DEFAULT_CATCH_UP_ROWS),
               }
        conf, hit = first_drafts(module, batches, held)
        row["calibration"] = calibration(conf, hit)
        row["gates"] = at_gates(conf, hit)
        if first is None:
            first = hit
        else:  # paired against the first file: tokens only this one lands, tokens only the first lands
            row["vs_first"] = (int((hit & ~first).sum()), int((first & ~hit).sum()))
        if not args.no_generation:
            row["landing"] = landing(path, file)
        results.append(row)
        print(_text(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _text(row: dict) -> str:
    a, s = row["answers"], row["answers_served"]
    lines = [f"{row['file']}", f"  held-out answer tokens acc1/acc2 {a['acc1']:.3f} / {a['acc2']:.3f}; "
             f"serving context {s['acc1']:.3f} / {s['acc2']:.3f}"]
    lines.append("  calibration (gate bucket: share of tokens, lands): " + "; ".join(
        f"{c['bucket']}: {c['share']:.2f}, {'-' if c['lands'] is None else format(c['lands'], '.2f')}"
        for c in row["calibration"]))
    lines.append("  at gate pmin (passes, lands, landed per token): " + "; ".join(
        f"{g['pmin']}: {g['passes']:.2f}, {'-' if g['lands'] is None else format(g['lands'], '.2f')}, "
        f"{g['landed_per_token']:.3f}" for g in row["gates"]))
    if "vs_first" in row:
        lines.append(f"  first drafts against the first file, teacher-forced: +{row['vs_first'][0]} "
                     f"-{row['vs_first'][1]} tokens")
    if "landing" in row:
        lines.append("  first drafts landed: " + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in row["landing"].items())
                     + f" = {row['landing']['all'][0] / max(1, row['landing']['all'][1]):.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
