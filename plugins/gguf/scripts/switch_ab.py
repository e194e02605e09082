"""Paired A/B of the compiled kernels' runtime switches on the embedded model.

For each switch, decodes the same request with the switch on and off, alternating which goes
first every round, and prints the per-round ratio (off / on wall time: above 1 means the switch's
path is faster; ``huge_pages``, whose path runs at load, pairs a second load made with it off).
A ``control`` row first pairs the default configuration with itself: its spread is the noise a
switch's ratio must clear. One process for every switch (load and warm-up paid once).
Usage: python plugins/gguf/scripts/switch_ab.py [--rounds 5] [--tokens 128] [--spec-type none]
[--dtype int8] [SWITCH ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import tsspec
from tsspec.runtime.options import SpeculationOptions
from tsspec_gguf import native

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and two tests."


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("switches", nargs="*")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--spec-type", default="auto", help="auto (ngram) or none (plain decoding)")
    parser.add_argument("--dtype", default=None, help="the load's dtype (int8: the int8 arithmetic's switches)")
    args = parser.parse_args()
    kernels = native.kernels()
    names = args.switches or sorted(n[4:] for n in dir(kernels) if n.startswith("set_") and n not in ("set_simd", "set_vnni", "set_pool_stats"))
    target = tsspec.load_model(dtype=args.dtype)
    options = SpeculationOptions(enabled=args.spec_type != "none", spec_type="auto" if args.spec_type == "none" else args.spec_type)

    def run(model=target) -> tuple[float, list[int]]:
        start = time.perf_counter()
        out = tsspec.generate(model, PROMPT, options, max_tokens=args.tokens)
        return time.perf_counter() - start, list(out.tokens)

    _, reference = run()  # warm-up, and the tokens every configuration must reproduce
    print(f"spec-type {args.spec_type}, dtype {args.dtype or 'default'}, {args.tokens} tokens, {args.rounds} rounds, "
          f"{native.info()}", flush=True)
    for name in ["control", *names]:
        setter = getattr(kernels, f"set_{name}") if name != "control" else (lambda on: None)
        models = {True: target, False: target}
        if name == "huge_pages":  # its path runs at load: a second load with it off, run alternately
            setter(False)
            models[False] = tsspec.load_model(dtype=args.dtype)
            setter(True)
            setter = lambda on: None  # noqa: E731
        ratios = []
        for r in range(args.rounds):
            times = {}
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                setter(on)
                times[on], tokens = run(models[on])
                assert tokens == reference, f"{name}={on} changed the output"
            setter(True)
            ratios.append(times[False] / times[True])
        print(f"{name:16s} off/on median {statistics.median(ratios):.3f}  min {min(ratios):.3f}  max {max(ratios):.3f}  "
              f"rounds {' '.join(f'{x:.3f}' for x in ratios)}", flush=True)


if __name__ == "__main__":
    main()
