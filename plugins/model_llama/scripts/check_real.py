"""tsspec against llama.cpp on the real Gemma 3 270M file (``make check-real``).

llama.cpp runs in its own process (llama-cpp-python: ``pip install llama-cpp-python``; this
script stops with a one-line message when it is missing). Both engines get the same prompt ids
(tsspec's tokenizer) and decode greedily; per prompt the script prints how many of the first
``--tokens`` tokens agree and, at the first split, both engines' top-2 logits there. A split
counts as a near-tie when in both engines the top-2 gap is below 1% of the top logit. Then it
compares llama.cpp's ``tokenize`` with tsspec's on the 200 strings of the tokenizer parity test
(``tests/test_gemma3_270m.py``), with and without the BOS token (special tokens parsed).

At every split an exact reference decides which engine is closer to the file's math:
transformers loading the same GGUF (its own dequantiser and model code) in float64, run on the
common prefix; the script prints its top-2 and each engine's largest logit error over the
candidate tokens (both engines' top-2), and whether each engine picked the reference's token.

    python plugins/model_llama/scripts/check_real.py [--model gemma3-270m] [--tokens 64] [--threads 2]
        [--dtype int8] [--llama-kv-f32] [--no-reference]

Exit status 0 when at least 5 of 6 prompts agree over every token, every split is a near-tie
and every string tokenizes alike; 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
    "Once upon a time, in a small village by the mountains,",
    "Q: What is 17 times 3?\nA:",
    "import numpy as np\n\nx = np.arange(10)\n# print the squares of x\n",
]
GAP = 0.01  # a split is a near-tie when top1 - top2 < GAP * |top1| in both engines

LLAMA_CPP_WORKER = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
req = json.load(sys.stdin)
kv = {"type_k": 0, "type_v": 0} if req["kv_f32"] else {}  # GGML_TYPE_F32 (default: F16)
llm = Llama(model_path=req["path"], n_ctx=1024, n_threads=req["threads"], n_batch=512, logits_all=False, verbose=False, **kv)
out = {"runs": [], "tokens": [], "watched": []}
for ids, watch in zip(req["prompts"], req["watch"]):
    llm.reset()
    llm.eval(ids)
    steps, seen = [], []
    for step in range(req["tokens"]):
        # the last token's logits straight from the context (without logits_all the wrapper keeps
        # no scores; eval_logits would copy every row)
        row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).astype(np.float32)
        top = np.argsort(-row)[:2]
        steps.append([[int(t), float(row[t])] for t in top])
        seen.append([[int(t), float(row[t])] for t in watch[step]])  # tsspec's top-2 in this row
        llm.eval([int(top[0])])
    out["runs"].append(steps)
    out["watched"].append(seen)
for s in req["strings"]:
    b = s.encode("utf-8")
    out["tokens"].append([llm.tokenize(b, add_bos=True, special=True), llm.tokenize(b, add_bos=False, special=True)])
json.dump(out, sys.stdout)
"""


def parity_strings() -> list[str]:
    """The 200 strings of the tokenizer parity test."""
    path = Path(__file__).resolve().parent.parent / "tests" / "test_gemma3_270m.py"
    spec = importlib.util.spec_from_file_location("_gemma_parity_strings", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._strings()


def tsspec_runs(target, prompts: list[list[int]], tokens: int) -> list[list]:
    """Greedy decode per prompt: each step's top-2 (id, logit)."""
    import torch

    runs = []
    for ids in prompts:
        target.reset()
        logits, _ = target.spec_forward(ids, all_logits_rows=False, want_hidden=False)
        steps = []
        for _ in range(tokens):
            top = torch.topk(logits[-1], 2)
            steps.append([[int(i), float(v)] for v, i in zip(top.values, top.indices)])
            logits, _ = target.spec_forward([steps[-1][0][0]], all_logits_rows=False, want_hidden=False)
        runs.append(steps)
    return runs


def reference_model(path: str):
    """transformers' model from the GGUF (its dequantiser, its model code), in float64."""
    import os

    import torch
    import transformers

    folder, name = os.path.split(path)
    # gemma3 is not on transformers' packed-GGUF path: its loader unpacks every tensor (whatever its
    # warning about packed weights says), so weights and matmuls are float64, which this checks
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float64).eval()
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float64}:
        raise SystemExit(f"check-real: the reference is not float64 throughout ({sorted(map(str, dtypes))})")
    return model


def row_logits(model, ids: list[int]):
    """The float64 logits of the row after ``ids`` (a full forward, no cache)."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def near_tie(top2) -> bool:
    (_, a), (_, b) = top2
    return a - b < GAP * abs(a)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default=None, help="tsspec's --dtype (int8: llama.cpp's int8 activations)")
    ap.add_argument("--llama-kv-f32", action="store_true", help="llama.cpp's KV cache in float32 (default: F16)")
    ap.add_argument("--no-reference", action="store_true", help="skip the float64 transformers reference at splits")
    args = ap.parse_args(argv)
    try:
        import llama_cpp  # noqa: F401  (only to fail early with a clear line; it runs in its own process)
    except ImportError:
        print("check-real: llama-cpp-python is not installed (pip install llama-cpp-python)", file=sys.stderr)
        return 2
    import torch

    import tsspec

    torch.set_num_threads(args.threads)
    target = tsspec.load_model(args.model, dtype=args.dtype)
    path = target.path
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    strings = parity_strings()
    ours = tsspec_runs(target, prompts, args.tokens)
    watch = [[[t for t, _ in step] for step in run] for run in ours]
    request = {"path": path, "threads": args.threads, "prompts": prompts, "tokens": args.tokens, "strings": strings,
               "kv_f32": args.llama_kv_f32, "watch": watch}
    done = subprocess.run([sys.executable, "-c", LLAMA_CPP_WORKER], input=json.dumps(request), capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        print(f"check-real: the llama.cpp process failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return 2
    theirs = json.loads(done.stdout)
    reference = None if args.no_reference else reference_model(path)
    closer = {"tsspec": 0, "llama.cpp": 0}
    picks = {"tsspec": 0, "llama.cpp": 0}
    splits = 0
    print(f"model {path} ({target.config.architecture}, {target.config.extra['weight_formats']}), "
          f"tsspec arithmetic {target.config.extra.get('arithmetic')}, llama-cpp-python {llama_cpp.__version__}, "
          f"KV cache {'F32' if args.llama_kv_f32 else 'F16'}, greedy, {args.tokens} tokens, {args.threads} threads")
    agreed, ties_ok = 0, True
    for n, (prompt, a, b) in enumerate(zip(PROMPTS, ours, theirs["runs"])):
        split = next((i for i, (x, y) in enumerate(zip(a, b)) if x[0][0] != y[0][0]), None)
        if split is None:
            agreed += 1
            print(f"prompt {n} {prompt[:40]!r}: {args.tokens}/{args.tokens} tokens agree")
            continue
        tie = near_tie(a[split]) and near_tie(b[split])
        ties_ok &= tie
        fmt = lambda top: ", ".join(f"{t}:{v:.4f}" for t, v in top)  # noqa: E731
        print(f"prompt {n} {prompt[:40]!r}: {split}/{args.tokens} tokens agree, split at token {split}: "
              f"tsspec top-2 [{fmt(a[split])}] gap {a[split][0][1] - a[split][1][1]:.4f}; "
              f"llama.cpp top-2 [{fmt(b[split])}] gap {b[split][0][1] - b[split][1][1]:.4f} "
              f"({'near-tie' if tie else 'NOT a near-tie'}: < {GAP:.0%} of the top logit)")
        if reference is None:
            continue
        splits += 1
        prefix = prompts[n] + [step[0][0] for step in a[:split]]
        ref = row_logits(reference, prefix)
        target.reset()
        mine, _ = target.spec_forward(prefix, all_logits_rows=False, want_hidden=False)
        mine = mine[-1].double()
        llama = dict(map(tuple, b[split])) | dict(map(tuple, theirs["watched"][n][split]))
        candidates = sorted({t for t, _ in a[split]} | {t for t, _ in b[split]})
        err_t = max(abs(float(mine[t]) - float(ref[t])) for t in candidates)
        err_l = max(abs(llama[t] - float(ref[t])) for t in candidates)  # llama.cpp's values of both top-2
        top = ref.topk(2)
        best = int(top.indices[0])
        picks["tsspec"] += a[split][0][0] == best
        picks["llama.cpp"] += b[split][0][0] == best
        closer["tsspec" if err_t < err_l else "llama.cpp"] += 1
        ref_top = ", ".join(f"{int(i)}:{float(v):.4f}" for v, i in zip(top.values, top.indices))
        gap = float(top.values[0] - top.values[1])
        print(f"  float64 reference top-2 [{ref_top}] gap {gap:.4f} "
              f"({'near-tie' if gap < GAP * abs(float(top.values[0])) else 'NOT a near-tie'}); "
              f"largest logit error over tokens {candidates}: tsspec {err_t:.2e}, llama.cpp {err_l:.2e}; "
              f"reference's token picked by tsspec: {a[split][0][0] == best}, by llama.cpp: {b[split][0][0] == best}")
    with_special = sum(target.tokenizer.encode(s) == t[0] for s, t in zip(strings, theirs["tokens"]))
    plain = sum(target.tokenizer.encode(s, add_special_tokens=False) == t[1] for s, t in zip(strings, theirs["tokens"]))
    print(f"greedy agreement: {agreed} of {len(PROMPTS)} prompts over all {args.tokens} tokens; "
          f"every split a near-tie: {ties_ok}")
    if splits:
        print(f"float64 reference at the {splits} splits: its token picked by tsspec {picks['tsspec']}, by llama.cpp "
              f"{picks['llama.cpp']}; closer logits: tsspec {closer['tsspec']}, llama.cpp {closer['llama.cpp']}")
    print(f"tokenizer parity with llama.cpp: {with_special}/{len(strings)} strings (with BOS, special tokens parsed), "
          f"{plain}/{len(strings)} (no BOS)")
    ok = agreed >= len(PROMPTS) - 1 and ties_ok and with_special == plain == len(strings)
    print("check-real:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
