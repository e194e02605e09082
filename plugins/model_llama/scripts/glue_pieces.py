"""Microseconds per one-row decode step outside the kernels, piece by piece, on the embedded
model after a prefill of ``--context`` tokens: the Python path around ``layers_forward`` (the
step before the one-call step, its pieces timed one by one as ``spec_forward`` ran them) and
the one-call step (``model_step``: the Python before and after the call, and the call's time
outside the blocks' and the LM head's pool work), and the greedy draw (torch's argmax against
numpy's). Medians over ``--rounds`` rounds of ``--steps`` steps, the two paths alternating.

    python plugins/model_llama/scripts/glue_pieces.py [--context 500] [--steps 20] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def main() -> int:
    from tsspec_gguf import native
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec_model_llama import load_llama
    from tsspec_model_llama.target import _embedding

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kernels = native.kernels()
    t = load_llama(embedded_model_path())
    t.spec_forward([5] * args.context, all_logits_rows=False, want_hidden=False)
    ns = time.perf_counter_ns

    def python_path(got: dict) -> None:
        """One step of the Python path, as spec_forward / forward_residual ran it (1 row)."""
        with torch.inference_mode():
            a = ns()
            ids = [int(x) for x in [5]]
            if min(ids) < 0 or max(ids) >= t.hparams.vocab_size:
                raise ValueError
            past = t._seq_len
            t.spec_ensure_capacity(past + 1)
            t._gemm_threads = t._active_threads = torch.get_num_threads()
            t._small_threads = 1
            t._threads(1)
            b = ns()
            x = _embedding(torch.tensor(ids), t._embed)
            c = ns()
            t._threads(t._gemm_threads)
            t._rope.ensure(past + 1)
            t._rope_table = torch.view_as_real(t._rope._rot).data_ptr()
            x = x.contiguous()
            d = ns()
            x = t._fused_blocks(x, past, None, {})
            e = ns()
            t._seq_len = past + 1
            normed = F.rms_norm(x[-1:], t._norm_shape, t._output_norm, t._eps)
            f = ns()
            logits = t._lm_head.linear(normed.to(t.dtype), precision=t.precision)
            g = ns()
            logits = logits.to(torch.device("cpu"), torch.float32)
            h = ns()
        token = int(torch.argmax(logits[-1]).item())
        i = ns()
        int(logits[-1].numpy().argmax()) == token or print("argmax differs")
        j = ns()
        for k, v in (("py: checks, capacity, threads", b - a), ("py: embedding (torch.tensor, BlockMatrix.rows)", c - b),
                     ("py: threads back, RoPE table", d - c), ("py: final norm (F.rms_norm)", f - e),
                     ("py: LM head call incl. gemm", g - f), ("py: logits .to()", h - g),
                     ("draw: torch.argmax", i - h), ("draw: numpy argmax", j - i), ("py: layers_forward call", e - d)):
            got.setdefault(k, []).append(v / 1e3)

    class Timed:
        def __init__(self, inner):
            self.inner, self.ns = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def model_step(self, *a):
            start = ns()
            self.inner.model_step(*a)
            self.ns += ns() - start

    def one_call(got: dict) -> None:
        timed = Timed(kernels)
        t._kernels = timed
        kernels.set_pool_stats(True)
        a = ns()
        t.spec_forward([5], all_logits_rows=False, want_hidden=False)
        b = ns()
        stats = kernels.pool_stats()
        kernels.set_pool_stats(False)
        t._kernels = kernels
        inside = stats["blocks"]["wall_ns"] + stats["gemm"]["wall_ns"]
        got.setdefault("one: Python around model_step", []).append((b - a - timed.ns) / 1e3)
        got.setdefault("one: model_step outside blocks and LM head regions", []).append((timed.ns - inside) / 1e3)
        got.setdefault("one: LM head gemm regions", []).append(stats["gemm"]["wall_ns"] / 1e3)

    got: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        for fn in (python_path, one_call) if rnd % 2 == 0 else (one_call, python_path):
            per: dict[str, list[float]] = {}
            for _ in range(args.steps):
                at = t.cache_seq_len
                fn(per)
                t.spec_rewind_cache(at + 1)
            for k, v in per.items():
                got.setdefault(k, []).append(statistics.median(v))
    print(f"threads {args.threads}; context {args.context}; {args.rounds} rounds of {args.steps} steps; us per step (medians)")
    for k, v in got.items():
        print(f"{k:52s} {statistics.median(v):9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
