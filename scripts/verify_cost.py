"""Forward cost by rows x context on the embedded model, for each block-kernel arithmetic.

For each context length, the model prefills that many real tokens, then forwards of 1, 4, 9 and
16 rows (every row's logits, as a verify) alternate, rewound after each; the float32 and int8
arithmetics alternate too (two loads of the same file), so each ratio pairs neighbouring runs.
Prints median milliseconds, the cost relative to one row, and int8's speed-up over float32.

    python scripts/verify_cost.py [--reps 5] [--contexts 100,500,1000] [--rows 1,4,9,16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import tsspec
from tsspec_bench.prompts import encode_case, load_prompt_set
from tsspec_bench.goals import token_stream
from tsspec_gguf import native
from tsspec_gguf.embedded import embedded_model_path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--contexts", default="100,500,1000")
    ap.add_argument("--rows", default="1,4,9,16")
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    path = embedded_model_path()
    targets = {a: tsspec.load_model(path, dtype=d) for a, d in (("float32", "float32-blocks"), ("int8", "int8"))}
    cases = [encode_case(targets["int8"], c) for c in load_prompt_set()]
    stream = token_stream(cases, max(contexts) + max(rows))
    print(f"kernels: {native.info()}")
    for ctx in contexts:
        for t in targets.values():
            t.reset()
            t.spec_forward(stream[:ctx], all_logits_rows=False, want_hidden=False)
        ms = {(a, r): [] for a in targets for r in rows}
        for rep in range(-1, args.reps):
            for r in rows:
                for a, t in targets.items():
                    start = time.perf_counter()
                    t.spec_forward(stream[ctx:ctx + r], all_logits_rows=True, want_hidden=False)
                    elapsed = (time.perf_counter() - start) * 1e3
                    t.spec_rewind_cache(ctx)
                    if rep >= 0:
                        ms[(a, r)].append(elapsed)
        for r in rows:
            cells = []
            for a in targets:
                med = statistics.median(ms[(a, r)])
                rel = statistics.median(x / y for x, y in zip(ms[(a, r)], ms[(a, rows[0])]))
                cells.append(f"{a} {med:6.1f} ms ({rel:.2f}x {rows[0]} row)")
            speed = statistics.median(f / i for f, i in zip(ms[("float32", r)], ms[("int8", r)]))
            print(f"context {ctx:5d}, {r:2d} rows: " + ", ".join(cells) + f"; int8 speed-up {speed:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
