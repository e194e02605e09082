"""Plain greedy decode speed of GGUF files in tsspec and llama.cpp, each side in its own process,
runs paired and alternating (the order reversed every round), with a plain-vs-plain control row.

    python plugins/model_llama/scripts/real_bench.py tsspec:A.gguf tsspec:B.gguf llama.cpp:B.gguf \
        llama.cpp@plain/generate/fa1:B.gguf [--rounds 5] [--tokens 128] [--threads 2]

Every side decodes the same prompt ids (tsspec's tokenizer of the first side's file) for
``--tokens`` tokens; a run's speed is its decode tok/s (tokens after the first over the time
after the first). The first side runs twice a round (the control: its spread is the noise
floor). Prints each side's median tok/s, the median of its paired ratios to the first side, and
the load average before and after. llama.cpp runs through the bench's peer worker (llama-cpp-
python, its plain ``generate`` variant with flash attention off; ``llama.cpp@CONFIG`` names another
of the worker's variants, e.g. ``plain/generate/fa1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROMPT = ("def merge_sort(items):\n    \"\"\"Sort a list with merge sort and return a new list.\"\"\"\n"
          "    if len(items) <= 1:\n        return list(items)\n")

TSSPEC_WORKER = r"""
import json, sys, torch, tsspec
torch.set_num_threads(int(sys.argv[2]))
target = tsspec.load_model(sys.argv[1])
print(json.dumps({"ready": {"formats": target.config.extra.get("weight_formats")}}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "quit":
        break
    target.reset()
    r = tsspec.generate(target, req["prompt_ids"], tsspec.SpeculationOptions(enabled=False),
                        max_tokens=req["max_tokens"])
    print(json.dumps({"tokens": list(r.tokens), "tps": r.stats.tokens_per_second}), flush=True)
"""


class Side:
    def __init__(self, spec: str, threads: int):
        engine, _, self.path = spec.partition(":")
        self.engine, _, config = engine.partition("@")
        self.config = config or "plain/generate/fa0"
        if self.engine not in ("tsspec", "llama.cpp") or not self.path or (config and self.engine != "llama.cpp"):
            raise SystemExit(f"real_bench: a side is tsspec:FILE or llama.cpp[@CONFIG]:FILE, got {spec!r}")
        cmd = ([sys.executable, "-c", TSSPEC_WORKER, self.path, str(threads)] if self.engine == "tsspec"
               else [sys.executable, "-m", "tsspec_bench.peer_worker", "llama.cpp", self.path, str(threads)])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline())
        if "ready" not in ready:
            raise SystemExit(f"real_bench: {spec}: {ready.get('error')}")
        self.name = f"{self.engine} {os.path.basename(self.path)}" + (f" {config}" if config else "")

    def run(self, ids: list[int], tokens: int) -> tuple[float, list[int]]:
        request = {"prompt_ids": ids, "max_tokens": tokens}
        if self.engine == "llama.cpp":
            request.update(op="generate", config=self.config, stop=[])
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        if "error" in answer:
            raise SystemExit(f"real_bench: {self.name}: {answer['error']}")
        return float(answer["tps"]), answer["tokens"]

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sides", nargs="+")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import tsspec

    first = args.sides[0].partition(":")[2]
    ids = tsspec.load_model(first).tokenizer.encode(PROMPT)
    sides = [Side(s, args.threads) for s in args.sides]
    control = Side(args.sides[0], args.threads)
    control.name += " (control)"
    everyone = [sides[0], control, *sides[1:]]
    load_before = os.getloadavg()
    for s in everyone:  # warm-up run each
        s.run(ids, 16)
    speeds: dict[str, list[float]] = {s.name: [] for s in everyone}
    outputs: dict[str, list[int]] = {}
    for r in range(args.rounds):
        for s in (everyone if r % 2 == 0 else everyone[::-1]):
            tps, tokens = s.run(ids, args.tokens)
            speeds[s.name].append(tps)
            outputs[s.name] = tokens
    load_after = os.getloadavg()
    for s in everyone:
        s.close()
    base = speeds[sides[0].name]
    print(f"plain greedy decode, {args.tokens} tokens, {args.threads} threads, {args.rounds} paired rounds "
          f"(order alternating); load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    for s in everyone:
        v = speeds[s.name]
        ratio = statistics.median(b / a for a, b in zip(base, v))
        same = outputs[s.name] == outputs[sides[0].name]
        print(f"  {s.name:44s} {statistics.median(v):6.1f} tok/s (runs {', '.join(f'{x:.1f}' for x in v)}); "
              f"paired ratio to the first side {ratio:.2f}x; tokens {'equal to' if same else 'differ from'} the first side's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
