"""Measure transformers 5.24's non-causal multi-row forward of deepseek_v4, and its cause.

A tiny random config (HCA rate 8, CSA rate 2, index_topk 4, a 2-head lightning indexer, 48
tokens). Prints, for transformers' own model:

* how far the rows of ``model(ids[:33])`` are from the same rows of ``model(ids[:48])``;
* how far ``model(ids[:48])`` is from its token-by-token cached decode, and the first row that
  differs;
* the same two numbers with ``Tensor.topk`` replaced by a stable descending sort (equal scores
  keep their entry order): if the differences vanish, the leak is the indexer's tie-breaking.

Run: ``python plugins/model_deepseek_v4/scripts/hf_causality.py`` (about 20 s on one core).
"""

from __future__ import annotations


import torch
from random_weights import randomize  # the sibling module (scripts run from this folder's path)

CONFIG = dict(
    vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=5, num_attention_heads=4,
    num_key_value_heads=1, head_dim=16, q_lora_rank=24, partial_rotary_factor=0.5, num_experts_per_tok=2,
    n_routed_experts=4, max_position_embeddings=128,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                 "compressed_sparse_attention", "heavily_compressed_attention"],
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
    compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 8},
    hc_mult=2, sliding_window=8, o_groups=2, o_lora_rank=12, index_n_heads=2, index_head_dim=16, index_topk=4,
)


def build(seed: int = 3):
    import transformers as t

    config = t.DeepseekV4Config(**CONFIG)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = t.DeepseekV4ForCausalLM(config).eval()
    # transformers' init zeroes sinks, biases, the hash table: draw them all
    randomize(model, torch.Generator().manual_seed(seed + 1), experts=4, full_noise=("embed", "sinks"))
    return config, model


@torch.no_grad()
def measure(config, model, ids) -> tuple[float, float, int | None]:
    from transformers.cache_utils import DynamicCache

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max())

    full = model(torch.tensor([ids]), use_cache=False).logits[0]
    short = model(torch.tensor([ids[:33]]), use_cache=False).logits[0]
    cache = DynamicCache(config=config)
    decode = torch.stack([model(torch.tensor([[t]]), cache=cache, use_cache=True).logits[0, -1] for t in ids])
    first = next((r for r in range(len(ids)) if rel(full[r], decode[r]) > 1e-4), None)
    return rel(short, full[:33]), max(rel(full[r], decode[r]) for r in range(len(ids))), first


class _Picked:
    def __init__(self, values, indices):
        self.values, self.indices = values, indices


def _stable_topk(self, k, dim=-1, largest=True, sorted=True):
    order = torch.sort(self, dim=dim, descending=largest, stable=True)
    return _Picked(order.values.narrow(dim, 0, k), order.indices.narrow(dim, 0, k))


def main() -> None:
    torch.set_num_threads(1)
    config, model = build()
    ids = torch.randint(0, 64, (48,), generator=torch.Generator().manual_seed(7)).tolist()
    a, b, first = measure(config, model, ids)
    print(f"transformers as shipped : prefix rows 33 vs 48 differ by {a:.3g} (relative); "
          f"prefill vs cached decode {b:.3g}, first differing row {first}")
    original = torch.Tensor.topk
    torch.Tensor.topk = _stable_topk
    try:
        a, b, first = measure(config, model, ids)
    finally:
        torch.Tensor.topk = original
    print(f"stable top-k tie-break  : prefix rows 33 vs 48 differ by {a:.3g} (relative); "
          f"prefill vs cached decode {b:.3g}, first differing row {first}")


if __name__ == "__main__":
    main()
