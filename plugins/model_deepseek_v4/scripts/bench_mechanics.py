"""Runtime mechanics of the DeepSeek V4 target on a tiny-but-not-trivial random model (CPU, float32).

Acceptance is meaningless on random weights, so this shows the mechanics only:

* verify cost by rows: one forward of r rows on top of a 160-token cache, r = 1, 2, 4, 8, 16
  (median ms, and the ratio to one row);
* rollback cost: ``spec_keep(1)`` after an 8-row verify (the whole state is kept by absolute
  position, so a rollback is a length), against re-forwarding the kept row (what a
  snapshot / restore design would pay at least);
* the testing kit's oracle speculator at per-token acceptance P = 0, 0.5, 1 (window 4, governor
  off): plain vs speculative tokens/s, paired and alternated, medians and ratios; every run's
  tokens must equal plain decoding.

The model: 6 layers (sliding, CSA, HCA, CSA, HCA, sliding), hidden 256, 8 heads of 64, q rank
128, 8 experts (top 2) of 256, 4 hyper-connection streams, window 64, CSA rate 4 (indexer 8 heads
x 32, top 16), HCA rate 32, vocabulary 2048; built with transformers (a test dependency) and
converted. Run: ``python plugins/model_deepseek_v4/scripts/bench_mechanics.py [--reps 3] [--verify-only]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from random_weights import randomize  # the sibling module (scripts run from this folder's path)

CONFIG = dict(
    vocab_size=2048, hidden_size=256, moe_intermediate_size=256, num_hidden_layers=6, num_attention_heads=8,
    num_key_value_heads=1, head_dim=64, q_lora_rank=128, partial_rotary_factor=0.25, num_experts_per_tok=2,
    n_routed_experts=8, max_position_embeddings=1024,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                 "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
    mlp_layer_types=["hash_moe", "moe", "moe", "moe", "moe", "moe"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
    hc_mult=4, sliding_window=64, o_groups=4, o_lora_rank=64, index_n_heads=8, index_head_dim=32, index_topk=16,
    num_nextn_predict_layers=0,
)


def build(dtype: str = "float32"):
    import transformers as t

    from tsspec_model_deepseek_v4.convert import convert_state_dict
    from tsspec_model_deepseek_v4.loader import load_from_source
    from tsspec_model_deepseek_v4.source import MemorySource

    config = t.DeepseekV4Config(**CONFIG)
    torch.manual_seed(0)
    model = t.DeepseekV4ForCausalLM(config)
    randomize(model, torch.Generator().manual_seed(1), experts=8)
    arch, meta, tensors = convert_state_dict(config, model.state_dict())
    return lambda: load_from_source(MemorySource(arch, meta, tensors), dtype=dtype)


def ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def verify_cost(make, reps: int) -> None:
    target = make()
    prompt = torch.randint(0, 2048, (160,), generator=torch.Generator().manual_seed(2)).tolist()
    target.spec_forward(prompt, all_logits_rows=False, want_hidden=False)
    target.spec_keep(len(prompt))
    base = None
    print("verify cost by rows (160 cached positions):")
    results = {}
    for _ in range(reps):  # alternate the row counts within each repetition
        for rows in (1, 2, 4, 8, 16):
            tokens = prompt[:rows]

            def run():
                target.spec_forward(tokens, all_logits_rows=True, want_hidden=False)
                target.spec_keep(rows)
                target.spec_rewind_cache(160)

            results.setdefault(rows, []).append(ms(run, 1))
    for rows, values in results.items():
        med = statistics.median(values)
        base = base or med
        print(f"  rows {rows:2d}: {med:7.2f} ms  ({med / base:4.2f}x one row)")
    keep_us, reforward_ms = [], []
    for _ in range(reps):
        target.spec_forward(prompt[:8], all_logits_rows=True, want_hidden=False)
        t0 = time.perf_counter()
        target.spec_keep(1)
        keep_us.append((time.perf_counter() - t0) * 1e6)
        target.spec_rewind_cache(160)
        t0 = time.perf_counter()
        target.spec_forward(prompt[:1], all_logits_rows=True, want_hidden=False)
        target.spec_keep(1)
        reforward_ms.append((time.perf_counter() - t0) * 1e3)
        target.spec_rewind_cache(160)
    print(f"rollback after an 8-row verify: spec_keep(1) {statistics.median(keep_us):.1f} us; "
          f"re-forwarding the kept row instead {statistics.median(reforward_ms):.2f} ms")
    print(f"state per position: {target.cache_bytes / max(1, 160 + 16):.0f} bytes allocated "
          f"({target.cache_bytes / 2**20:.2f} MiB for the cache)")


def oracle_runs(make, reps: int, tokens: int) -> None:
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.testing import OracleSpeculator

    prompt = torch.randint(0, 2048, (32,), generator=torch.Generator().manual_seed(3)).tolist()
    plain_ref = generate(make(), prompt, SpeculationOptions(enabled=False), max_tokens=tokens)
    sequence = prompt + plain_ref.tokens
    print(f"oracle speculator, window 4, {tokens} tokens, governor off ({reps} paired runs, medians):")
    for p in (0.0, 0.5, 1.0):
        plain_tps, spec_tps, accepted = [], [], []
        for _ in range(reps):
            plain = generate(make(), prompt, SpeculationOptions(enabled=False), max_tokens=tokens)
            spec_target = make()
            speculator = OracleSpeculator(sequence, corrupt=1.0 - p, vocab_size=2048, max_draft_tokens=4, seed=5)
            spec = generate(spec_target, prompt, SpeculationOptions(adaptive=False, draft=4), max_tokens=tokens,
                            speculator=speculator)
            assert spec.tokens == plain.tokens, "speculative output differs from plain decoding"
            plain_tps.append(tokens / (plain.stats.decode_ms / 1e3))
            spec_tps.append(tokens / (spec.stats.decode_ms / 1e3))
            accepted.append(spec.stats.accepted_tokens / max(1, spec.stats.draft_tokens))
        a, b = statistics.median(plain_tps), statistics.median(spec_tps)
        print(f"  P={p:.1f}: plain {a:6.1f} tok/s, speculative {b:6.1f} tok/s, ratio {b / a:4.2f}x "
              f"(accepted {statistics.median(accepted):.2f} of drafts)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--verify-only", action="store_true", help="only the verify cost and rollback figures")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    make = build()
    verify_cost(make, args.reps)
    if not args.verify_only:
        oracle_runs(make, args.reps, args.tokens)


if __name__ == "__main__":
    main()
