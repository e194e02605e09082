"""A step's split between the blocks and the LM head, by row count (a quick timer, not a benchmark).

After a 60-token prompt, per row count: ``spec_forward`` of that many rows (every row's logits),
the blocks alone (``forward_residual``) and the LM head alone (``_logits`` on random rows); the
fastest and the lower-quartile time of 25 calls each, the cache rewound after every call.

    python plugins/model_llama/scripts/step_split.py MODEL.gguf [ROWS,ROWS,...]
"""

from __future__ import annotations

import sys
import time

import torch

from tsspec_model_llama import load_llama


def main() -> None:
    torch.set_num_threads(2)
    t = load_llama(sys.argv[1])
    ids = t.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n" * 4)
    t.spec_forward(ids, all_logits_rows=False, want_hidden=False)
    past = t.cache_seq_len

    def best(f, n=25):
        xs = []
        for _ in range(n):
            t.spec_rewind_cache(past)
            s = time.perf_counter()
            f()
            xs.append((time.perf_counter() - s) * 1e3)
        xs.sort()
        return xs[0], xs[len(xs) // 4]

    for rows in [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "1,8,9").split(",")]:
        toks = ids[:rows]
        full = best(lambda: t.spec_forward(toks, all_logits_rows=True, want_hidden=False))
        blocks = best(lambda: t.forward_residual(toks))
        x = torch.randn(rows, t.hparams.hidden_size)
        head = best(lambda: t._logits(x))
        print(f"rows {rows}: step min/q1 {full[0]:.2f}/{full[1]:.2f} ms, blocks {blocks[0]:.2f}/{blocks[1]:.2f}, "
              f"lm_head {head[0]:.2f}/{head[1]:.2f}", flush=True)


if __name__ == "__main__":
    main()
