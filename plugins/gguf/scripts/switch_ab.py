"""Paired A/B of the compiled kernels' runtime switches on the embedded model.

For each switch, decodes the same request with the switch on and off, alternating which goes
first every round, and prints the per-round ratio (off / on wall time: above 1 means the switch's
path is faster). One process and one loaded model for every switch, so load time and warm-up are
paid once. Usage: python plugins/gguf/scripts/switch_ab.py [--rounds 5] [--tokens 128] [SWITCH ...]
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
    args = parser.parse_args()
    kernels = native.kernels()
    names = args.switches or sorted(n[4:] for n in dir(kernels) if n.startswith("set_") and n not in ("set_simd", "set_pool_stats"))
    target = tsspec.load_model()
    options = SpeculationOptions(enabled=args.spec_type != "none", spec_type="auto" if args.spec_type == "none" else args.spec_type)

    def run() -> tuple[float, list[int]]:
        start = time.perf_counter()
        out = tsspec.generate(target, PROMPT, options, max_tokens=args.tokens)
        return time.perf_counter() - start, list(out.tokens)

    _, reference = run()  # warm-up, and the tokens every configuration must reproduce
    for name in names:
        setter = getattr(kernels, f"set_{name}")
        ratios = []
        for r in range(args.rounds):
            times = {}
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                setter(on)
                times[on], tokens = run()
                assert tokens == reference, f"{name}={on} changed the output"
            setter(True)
            ratios.append(times[False] / times[True])
        print(f"{name:16s} off/on median {statistics.median(ratios):.3f}  min {min(ratios):.3f}  max {max(ratios):.3f}  "
              f"rounds {' '.join(f'{x:.3f}' for x in ratios)}", flush=True)


if __name__ == "__main__":
    main()
