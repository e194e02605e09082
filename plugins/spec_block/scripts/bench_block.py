"""Cost of one drafted DFlash block against one target decode step, on the embedded model.

The question a block drafter must answer on a CPU: is drafting a whole window cheaper than the
target step it hopes to save? This loads the embedded SmolLM2-135M-Instruct (via the llama
plugin, float32), attaches a RANDOM 1-layer DFlash drafter shaped for it (the cost of a pass
does not depend on the weights), builds a context of ``--context`` tokens, then times

* one target decode step: a one-row ``spec_forward`` with the feature taps on (rewound after);
* one drafted block: ``draft_block`` = inject the carry row + the block pass + the target's LM
  head on ``block - 1`` rows + argmax (or the selector walk with ``--dflash2``),

and prints the medians and their ratio (target: a block costs less than one target step).

    python plugins/spec_block/scripts/bench_block.py --context 512 --repeats 15
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def median_ms(fn, repeats: int, warmup: int = 2) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times), times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=512, help="tokens in the context before timing")
    parser.add_argument("--block", type=int, default=16, help="drafter block size (anchor included)")
    parser.add_argument("--layers", type=int, default=1, help="drafter layers")
    parser.add_argument("--window", type=int, default=2048, help="drafter sliding window")
    parser.add_argument("--drafts", type=int, default=8, help="a second figure: drafts per pass at the default window")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--dflash2", action="store_true", help="add the DFlash2 conv and selector (rank 256, top 16)")
    parser.add_argument("--model", default=None, help="a llama-family GGUF (default: the embedded model)")
    args = parser.parse_args(argv)

    import torch

    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime.loading import LoadOptions
    from tsspec_model_llama import load_llama

    from tsspec_block.attach import attach_dflash
    from tsspec_block.random_drafter import write_random_dflash

    if args.threads:
        torch.set_num_threads(args.threads)
    model_path = args.model or str(embedded_model_path())
    target = load_llama(model_path, LoadOptions())
    cfg = target.config
    layers = cfg.num_layers
    taps = [2, layers // 2, layers]  # three residuals, low / mid / top, EAGLE-3 / DFlash style
    hp = target.hparams
    extra = dict(conv=(2, 16), selector=(256, 16), vocab_size=cfg.vocab_size) if args.dflash2 else {}
    with tempfile.TemporaryDirectory() as tmp:
        drafter = write_random_dflash(
            Path(tmp) / "random-dflash.gguf", hidden_size=cfg.hidden_size, target_layers=taps,
            mask_token_id=0, num_layers=args.layers, n_head=hp.n_heads, n_head_kv=hp.n_kv_heads,
            head_dim=hp.head_dim, ffn_size=hp.ffn_size,
            block_size=args.block, sliding_window=args.window, **extra)
        head = attach_dflash(target, drafter)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, cfg.vocab_size, (args.context + 1,), generator=g).tolist()
    with torch.inference_mode():
        target.spec_ensure_capacity(args.context + 2)
        _, feats = target.spec_forward(ids[:-1], all_logits_rows=False, want_hidden=True)
        target.spec_keep(len(ids) - 1)
        head.draft_catch_up(ids[:-1], torch.cat([torch.zeros_like(feats[:1]), feats[:-1]]), 0)
        carry, last, position = feats[-1], ids[-1], args.context

        def target_step():
            target.spec_forward([last], all_logits_rows=False, want_hidden=True)
            target.spec_keep(1)
            target.spec_rewind_cache(position)

        def draft_block():
            head.draft_block(last, carry, position, args.block - 1)

        def draft_window():
            head.draft_block(last, carry, position, args.drafts)

        def block_pass():
            head.block_hidden(last, position)

        step_ms, _ = median_ms(target_step, args.repeats)
        block_ms, _ = median_ms(draft_block, args.repeats)
        window_ms, _ = median_ms(draft_window, args.repeats)
        pass_ms, _ = median_ms(block_pass, args.repeats)
        rows = head.block_hidden(last, position)[1:]
        head_ms, _ = median_ms(lambda: target.lm_head(rows), args.repeats)

    kind = "DFlash2 (conv + selector)" if args.dflash2 else "DFlash"
    print(f"model {Path(model_path).name}: {layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}; "
          f"torch threads {torch.get_num_threads()}; context {args.context}")
    print(f"drafter: random {args.layers}-layer {kind}, block {args.block}, window {args.window}, taps {taps}")
    print(f"target decode step (1 row, taps on):      {step_ms:8.2f} ms  (median of {args.repeats})")
    print(f"drafted block (draft_block, {args.block - 1} drafts):   {block_ms:8.2f} ms")
    print(f"  of which block pass to final norm:      {pass_ms:8.2f} ms")
    print(f"  of which target LM head, {args.block - 1} rows:      {head_ms:8.2f} ms")
    print(f"drafted window (draft_block, {args.drafts} drafts):    {window_ms:8.2f} ms  ({window_ms / step_ms:.2f}x a step)")
    print(f"block / target step: {block_ms / step_ms:.2f}x  ({'cheaper' if block_ms < step_ms else 'NOT cheaper'} "
          "than one target step)")


if __name__ == "__main__":
    main()
