"""What one block pass of a DFlash drafter costs on the embedded model, by piece.

Loads the embedded SmolLM2-135M-Instruct and a DFlash drafter (default: the shipped one),
injects a 64-token context, then times (median of ``--repeats`` after a warm-up):

* ``draft_block`` for 7 rows (the whole block scored);
* a catch-up of 64 committed rows (``inject_rows``);
* one plain target step (one row, the feature taps on), for scale.

With ``--threads 1`` the times are the thread's CPU time (``time.thread_time``: another job on
the core does not inflate them); otherwise wall time. The script runs under any checkout's
environment (it uses only what that checkout's head offers), so two environments can be
compared by running it alternately in each:

    for i in 1 2 3; do .venv/bin/python plugins/spec_block/scripts/pass_cost.py --threads 1
                       ../main/.venv/bin/python plugins/spec_block/scripts/pass_cost.py --threads 1; done
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default=None, help="a dflash GGUF (default: the shipped SmolLM2 drafter)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--label", default="", help="a name for this environment in the output")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime.loading import LoadOptions
    from tsspec_model_llama import load_llama

    from tsspec_block.attach import attach_dflash

    drafter = args.drafter
    if drafter is None:
        import tsspec_drafters_smollm2

        drafter = str(tsspec_drafters_smollm2.HERE / "smollm2-135m-instruct-dflash.gguf")
    target = load_llama(str(embedded_model_path()), LoadOptions())
    head = attach_dflash(target, drafter)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 4000, (65,), generator=g).tolist()
    out = {"label": args.label, "threads": args.threads, "clock": "thread CPU" if args.threads == 1 else "wall",
           "native": getattr(head, "native", None) is not None}
    with torch.inference_mode():
        target.spec_ensure_capacity(70)
        _, feats = target.spec_forward(ids[:-1], all_logits_rows=False, want_hidden=True)  # [64, F]
        head.draft_catch_up(ids[:-1], torch.cat([torch.zeros_like(feats[:1]), feats[:-1]]), 0)
        last, pos = ids[-1], 64

        def median_ms(fn) -> float:
            for _ in range(3):
                fn()
            times = []
            for _ in range(args.repeats):
                start = clock()
                fn()
                times.append((clock() - start) * 1000.0)
            return round(statistics.median(times), 3)

        def target_step():
            target.spec_forward([last], all_logits_rows=False, want_hidden=True)
            target.spec_rewind_cache(pos)

        out["block_7_rows_ms"] = median_ms(lambda: head.draft_block(last, None, pos, 7))
        out["catch_up_64_ms"] = median_ms(lambda: head.inject_rows(torch.arange(0, 64), feats))
        out["target_step_ms"] = median_ms(target_step)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
