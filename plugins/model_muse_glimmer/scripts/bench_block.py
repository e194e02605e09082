"""Cost of one drafted DFlash block against one Muse-Glimmer target step, and the selector's
readback size.

Builds a RANDOM Muse-Glimmer trunk (default 4 layers, 512 wide, Q8_0 blocks, the 3:1 sliding /
global pattern, window 2048) and a RANDOM 1-layer DFlash (or, with ``--dflash2``, DFlash2: conv +
selector) drafter of the same width with three taps (the cost of a pass does not depend on the
weights), fills ``--context`` tokens, then times PAIRED, alternating runs of

* one target decode step: a one-row ``spec_forward`` with the taps on (rewound after);
* one drafted block: ``draft_block`` (carry row + block pass + the target's LM head on
  ``block - 1`` rows + argmax, or the selector walk);
* one verify of the drafted block: a ``block``-row ``spec_forward`` (rewound after).

It prints the medians, the median of the per-pair ratios, and the selector's readback size
(what must leave a device per block: ``k + k*k*(gamma-1)`` floats) against the naive
``[vocab, gamma]`` logits, for this vocabulary and the released model's 202048.

    python plugins/model_muse_glimmer/scripts/bench_block.py --context 512 --repeats 15 --dflash2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

RELEASED_VOCAB = 202048


def random_trunk(path, *, layers, hidden, heads, kv_heads, ffn, vocab, window, seed=0):
    """A random muse-glimmer GGUF (Q8_0 matrices) written with the plugin's key names."""
    import numpy as np
    from gguf import GGMLQuantizationType as T

    from tsspec_gguf.gguf_writer_util import write_gguf

    rng = np.random.default_rng(seed)
    hd = hidden // heads

    def w(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols), T.Q8_0)

    ones = np.ones(hidden, np.float32)
    a = "muse-glimmer."
    meta = {
        a + "block_count": layers, a + "context_length": 8192, a + "embedding_length": hidden,
        a + "feed_forward_length": ffn, a + "attention.head_count": heads, a + "attention.head_count_kv": kv_heads,
        a + "attention.key_length": hd, a + "attention.value_length": hd,
        a + "attention.layer_norm_rms_epsilon": 1e-5, a + "attention.sliding_window": window,
        a + "attention.sliding_window_pattern": [(layers - 1 - i) % 4 != 0 for i in range(layers)],
        a + "rope.freq_base": 500000.0, a + "logit_scale": (hidden / 256) ** -0.5, a + "final_logit_softcapping": 20.0,
    }
    tensors = {"token_embd.weight": w(vocab, hidden), "output.weight": w(vocab, hidden), "output_norm.weight": ones}
    for i in range(layers):
        p = f"blk.{i}."
        tensors.update({
            p + "attn_norm.weight": ones, p + "post_attention_norm.weight": ones, p + "ffn_norm.weight": ones,
            p + "post_ffw_norm.weight": ones, p + "attn_q_norm.weight": np.full(hd, 3.87, np.float32),
            p + "attn_k_norm.weight": np.ones(hd, np.float32),
            p + "attn_q.weight": w(heads * hd, hidden), p + "attn_k.weight": w(kv_heads * hd, hidden),
            p + "attn_v.weight": w(kv_heads * hd, hidden), p + "attn_gate.weight": w(heads * hd, hidden),
            p + "attn_output.weight": w(hidden, heads * hd), p + "ffn_gate.weight": w(ffn, hidden),
            p + "ffn_up.weight": w(ffn, hidden), p + "ffn_down.weight": w(hidden, ffn),
        })
    return write_gguf(path, "muse-glimmer", meta, tensors)


def paired(a, b, repeats: int, warmup: int = 2):
    """Alternating runs of a and b: (median a ms, median b ms, median of b/a per pair)."""
    for _ in range(warmup):
        a()
        b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, out in ((a, ta), (b, tb)):
            start = time.perf_counter()
            fn()
            out.append((time.perf_counter() - start) * 1000.0)
    ratios = [y / x for x, y in zip(ta, tb)]
    return statistics.median(ta), statistics.median(tb), statistics.median(ratios)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--block", type=int, default=16, help="drafter block size (anchor included)")
    parser.add_argument("--drafter-layers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--dflash2", action="store_true", help="DFlash2: conv (K 2, groups of 16) + selector (rank 256, top 16)")
    args = parser.parse_args(argv)

    import torch

    from tsspec_block.attach import attach_dflash
    from tsspec_block.random_drafter import write_random_dflash
    from tsspec_model_muse_glimmer import load_muse_glimmer

    if args.threads:
        torch.set_num_threads(args.threads)
    heads, kv_heads, ffn = args.hidden // 64, 2, 3 * args.hidden
    taps = [1, max(1, args.layers // 2), args.layers - 1]
    top_k, rank = 16, 256
    extra = dict(conv=(2, 16), selector=(rank, top_k), vocab_size=args.vocab, logit_scale=(args.hidden / 256) ** -0.5,
                 softcap=20.0) if args.dflash2 else {}
    with tempfile.TemporaryDirectory() as tmp:
        trunk = random_trunk(Path(tmp) / "muse.gguf", layers=args.layers, hidden=args.hidden, heads=heads,
                             kv_heads=kv_heads, ffn=ffn, vocab=args.vocab, window=2048)
        target = load_muse_glimmer(trunk)
        drafter = write_random_dflash(
            Path(tmp) / "dflash.gguf", hidden_size=args.hidden, target_layers=taps, mask_token_id=0,
            num_layers=args.drafter_layers, n_head=heads, n_head_kv=kv_heads, head_dim=64, ffn_size=ffn,
            block_size=args.block, sliding_window=2048, **extra)
        head = attach_dflash(target, drafter)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, args.vocab, (args.context + args.block,), generator=g).tolist()
    position = args.context
    with torch.inference_mode():
        _, feats = target.spec_forward(ids[:position], all_logits_rows=False, want_hidden=True)
        head.draft_catch_up(ids[:position], torch.cat([torch.zeros_like(feats[:1]), feats[:-1]]), 0)
        carry, last = feats[-1], ids[position]

        def target_step():
            target.spec_forward([last], all_logits_rows=False, want_hidden=True)
            target.spec_rewind_cache(position)

        def verify():
            target.spec_forward(ids[position : position + args.block], all_logits_rows=True, want_hidden=True)
            target.spec_rewind_cache(position)

        def draft_block():
            head.draft_block(last, carry, position, args.block - 1)

        rows = head.block_hidden(last, position)[1:]

        def lm_head():
            target.lm_head(rows)

        step_ms, block_ms, block_ratio = paired(target_step, draft_block, args.repeats)
        step2_ms, verify_ms, verify_ratio = paired(target_step, verify, args.repeats)
        _, head_ms, head_ratio = paired(target_step, lm_head, args.repeats)

    gamma = args.block - 1
    kind = "DFlash2 (conv + selector)" if args.dflash2 else "DFlash"
    print(f"target: random muse-glimmer, {args.layers} layers, hidden {args.hidden}, heads {heads}/{kv_heads}, "
          f"ffn {ffn}, vocab {args.vocab}, Q8_0 blocks; torch threads {torch.get_num_threads()}; context {args.context}")
    print(f"drafter: random {args.drafter_layers}-layer {kind}, block {args.block}, taps {taps}")
    print(f"target decode step (1 row, taps on): {step_ms:8.2f} ms   (median of {args.repeats}, paired)")
    print(f"drafted block ({gamma} drafts):        {block_ms:8.2f} ms   block/step {block_ratio:.2f}x (median of pair ratios)")
    print(f"  of which the target's LM head on {gamma} rows: {head_ms:8.2f} ms   ({head_ratio:.2f}x a step)")
    print(f"target verify ({args.block} rows):            {verify_ms:8.2f} ms   verify/step {verify_ratio:.2f}x "
          f"(step here {step2_ms:.2f} ms)")
    readback = top_k + top_k * top_k * (gamma - 1)
    for vocab in (args.vocab, RELEASED_VOCAB):
        naive = vocab * gamma
        print(f"selector readback per block (k={top_k}, gamma={gamma}): {readback} floats vs naive [vocab={vocab}, "
              f"{gamma}] {naive} floats: {naive / readback:.0f}x less")


if __name__ == "__main__":
    main()
