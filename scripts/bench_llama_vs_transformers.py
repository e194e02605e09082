"""Plain greedy decode speed of tsspec-model-llama against transformers on the same GGUF.

Paired, alternating runs in one process (the order flips every run, so drift in machine load
hits both sides alike), median of ``--runs``. Both sides decode the same prompt greedily for
``--tokens`` new tokens with no early stop. Reported per side: end-to-end tok/s (prefill
included, what a user waits for) and decode-only tok/s (after the first token; transformers'
first-token time comes from a streamer). Also: the warm-cache load time of our loader, in this
process and in a fresh interpreter (imports included).

    python scripts/bench_llama_vs_transformers.py            # the embedded model, default weights
    python scripts/bench_llama_vs_transformers.py --dtypes float32,float16 --threads 1 --json

With several ``--dtypes`` every round runs each of our variants and transformers, in an order
that rotates from round to round. On a busy shared machine set ``OMP_WAIT_POLICY=PASSIVE``
(two OpenMP threads otherwise spin-wait on each other whenever another process holds a core).
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
    parser.add_argument("--dtypes", default="auto", help="our weight modes, comma-separated: auto (the default: quantised blocks on the CPU), float32, float16, bfloat16")
    parser.add_argument("--request", default=DEFAULT_REQUEST)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from tsspec_gguf.embedded import embedded_model_path
    from tsspec_model_llama import load_llama

    path = str(args.model or embedded_model_path())
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    ours_models = {}
    warm_load = {}
    for dtype in dtypes:
        load_llama(path, {"dtype": dtype})  # make sure the cache is warm
        started = time.perf_counter()
        ours_models[dtype] = load_llama(path, {"dtype": dtype})
        warm_load[dtype] = time.perf_counter() - started
    fresh_load = fresh_process_load_seconds(path)

    import transformers

    transformers.logging.set_verbosity_error()
    started = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    hf_load = time.perf_counter() - started

    tok = ours_models[dtypes[0]].tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": args.request}]))
    contenders = [(f"tsspec-{d}", run_ours, ours_models[d]) for d in dtypes] + [("transformers", run_hf, hf)]
    for _, fn, model in contenders:  # warm-up
        fn(model, ids, 8)
    results: dict[str, list[dict]] = {name: [] for name, _, _ in contenders}
    for run in range(args.runs):
        shift = run % len(contenders)
        for name, fn, model in contenders[shift:] + contenders[:shift]:
            results[name].append(fn(model, ids, args.tokens))

    def rate(name, key):
        n = args.tokens if key == "total_s" else args.tokens - 1
        return statistics.median(n / r[key] for r in results[name])

    hf_rate, hf_decode = rate("transformers", "total_s"), rate("transformers", "decode_s")
    report = {
        "model": path,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
        "prompt_tokens": len(ids),
        "new_tokens": args.tokens,
        "runs": args.runs,
        "hf_tok_s": hf_rate,
        "hf_decode_tok_s": hf_decode,
        "hf_load_s": hf_load,
        "fresh_process_warm_load_s": fresh_load,
        "ours": {},
    }
    for dtype in dtypes:
        name = f"tsspec-{dtype}"
        report["ours"][dtype] = {
            "tok_s": rate(name, "total_s"),
            "decode_tok_s": rate(name, "decode_s"),
            "ratio": rate(name, "total_s") / hf_rate,
            "decode_ratio": rate(name, "decode_s") / hf_decode,
            "warm_load_s": warm_load[dtype],
            "identical_tokens_to_transformers": results[name][0]["tokens"] == results["transformers"][0]["tokens"],
        }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"model {path}  threads {report['threads']}  OMP_WAIT_POLICY {report['omp_wait_policy']}  "
              f"prompt {len(ids)} tokens  +{args.tokens} greedy, median of {args.runs} rotated rounds")
        print(f"transformers        {hf_rate:6.1f} tok/s end-to-end   {hf_decode:6.1f} tok/s decode   "
              f"load {hf_load:.1f} s")
        for dtype, r in report["ours"].items():
            print(f"tsspec {dtype:<12} {r['tok_s']:6.1f} tok/s end-to-end   {r['decode_tok_s']:6.1f} tok/s decode   "
                  f"ratio {r['ratio']:.2f}x ({r['decode_ratio']:.2f}x decode)   warm load {r['warm_load_s']:.2f} s   "
                  f"same tokens as transformers: {r['identical_tokens_to_transformers']}")
        print(f"fresh interpreter, warm cache: import + load {fresh_load:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
