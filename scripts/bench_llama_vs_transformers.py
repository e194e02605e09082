"""Plain greedy decode speed of tsspec-model-llama against transformers on the same GGUF.

Paired, alternating runs in one process (the order flips every run, so drift in machine load
hits both sides alike), median of ``--runs``. Both sides decode the same prompt greedily for
``--tokens`` new tokens with no early stop. Reported per side: end-to-end tok/s (prefill
included, what a user waits for) and decode-only tok/s (after the first token; transformers'
first-token time comes from a streamer). Also: the warm-cache load time of our loader, in this
process and in a fresh interpreter (imports included).

    python scripts/bench_llama_vs_transformers.py            # the embedded model
    python scripts/bench_llama_vs_transformers.py --model x.gguf --tokens 128 --runs 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

DEFAULT_REQUEST = (
    "Rewrite this Python function to be more readable and add a docstring:\n"
    "def f(l):\n    r = []\n    for i in l:\n        if i % 2 == 0:\n            r.append(i * i)\n    return r"
)


class FirstTokenClock:
    """A transformers streamer that notes when the first generated token arrives."""

    def __init__(self):
        self.calls = 0
        self.first = None

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.first is None:  # call 1 is the prompt, call 2 the first token
            self.first = time.perf_counter()

    def end(self):
        pass


def run_ours(target, ids: list[int], n: int) -> dict:
    target.spec_rewind_cache(0)
    start = time.perf_counter()
    logits, _ = target.spec_forward(ids, all_logits_rows=False, want_hidden=False)
    token = int(logits[-1].argmax())
    first = time.perf_counter()
    out = [token]
    for _ in range(n - 1):
        logits, _ = target.spec_forward([token], all_logits_rows=False, want_hidden=False)
        token = int(logits[-1].argmax())
        out.append(token)
    end = time.perf_counter()
    return {"tokens": out, "total_s": end - start, "decode_s": end - first}


def run_hf(model, ids: list[int], n: int) -> dict:
    clock = FirstTokenClock()
    input_ids = torch.tensor([ids])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            streamer=clock,
        )
    end = time.perf_counter()
    return {"tokens": out[0, len(ids):].tolist(), "total_s": end - start, "decode_s": end - clock.first}


def fresh_process_load_seconds(path: str) -> float:
    """Wall time of `python -c 'import ...; load_llama(path)'` with a warm cache."""
    code = (
        "import time; t = time.perf_counter(); from tsspec_model_llama import load_llama; "
        f"load_llama({path!r}); print(time.perf_counter() - t)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF path (default: the embedded SmolLM2)")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--request", default=DEFAULT_REQUEST)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from tsspec.modeling.embedded import embedded_model_path
    from tsspec_model_llama import load_llama

    path = str(args.model or embedded_model_path())
    load_llama(path)  # make sure the cache is warm
    started = time.perf_counter()
    target = load_llama(path)
    warm_load = time.perf_counter() - started
    fresh_load = fresh_process_load_seconds(path)

    import transformers

    transformers.logging.set_verbosity_error()
    started = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    hf_load = time.perf_counter() - started

    tok = target.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": args.request}]))
    run_ours(target, ids, 8)  # warm-up both sides
    run_hf(hf, ids, 8)
    ours, theirs = [], []
    for run in range(args.runs):
        pair = [("ours", run_ours, target), ("hf", run_hf, hf)]
        for name, fn, model in pair if run % 2 == 0 else reversed(pair):
            (ours if name == "ours" else theirs).append(fn(model, ids, args.tokens))

    def rate(results, key):
        n = args.tokens if key == "total_s" else args.tokens - 1
        return statistics.median(n / r[key] for r in results)

    same = ours[0]["tokens"] == theirs[0]["tokens"]
    report = {
        "model": path,
        "threads": torch.get_num_threads(),
        "prompt_tokens": len(ids),
        "new_tokens": args.tokens,
        "runs": args.runs,
        "ours_tok_s": rate(ours, "total_s"),
        "hf_tok_s": rate(theirs, "total_s"),
        "ours_decode_tok_s": rate(ours, "decode_s"),
        "hf_decode_tok_s": rate(theirs, "decode_s"),
        "warm_load_s": warm_load,
        "fresh_process_warm_load_s": fresh_load,
        "hf_load_s": hf_load,
        "identical_tokens": same,
    }
    report["ratio"] = report["ours_tok_s"] / report["hf_tok_s"]
    report["decode_ratio"] = report["ours_decode_tok_s"] / report["hf_decode_tok_s"]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"model {path}  threads {report['threads']}  prompt {len(ids)} tokens  +{args.tokens} greedy, "
              f"median of {args.runs} paired runs")
        print(f"end-to-end   tsspec {report['ours_tok_s']:6.1f} tok/s   transformers {report['hf_tok_s']:6.1f} tok/s"
              f"   ratio {report['ratio']:.2f}x")
        print(f"decode only  tsspec {report['ours_decode_tok_s']:6.1f} tok/s   transformers "
              f"{report['hf_decode_tok_s']:6.1f} tok/s   ratio {report['decode_ratio']:.2f}x")
        print(f"load (warm cache)  {warm_load:.2f} s in-process, {fresh_load:.2f} s fresh interpreter "
              f"(transformers: {hf_load:.1f} s)")
        print(f"identical greedy tokens: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
