"""A tiny random llama written as a GGUF (no tokenizer): the teacher of the trainer tests.

Three layers so that taps can sit at different depths; 128 tokens so that a draft vocabulary
is a real subset; everything else as small as the llama path allows. Attention is weak
(``attn_gain``): the next token depends mostly on the current one and a little on the context,
so a few dozen optimiser steps can learn something a random model does."""

from __future__ import annotations

import numpy as np

SHAPE = dict(vocab=128, hidden=32, ffn=64, layers=3, heads=4, kv_heads=2, context=512)


def write_tiny_target(path, seed: int = 0, attn_gain: float = 0.1) -> str:
    from tsspec.modeling.gguf_writer import write_gguf

    s = SHAPE
    rng = np.random.default_rng(seed)
    H, kv = s["hidden"], s["kv_heads"] * s["hidden"] // s["heads"]

    def matrix(rows, cols, gain=0.3):
        return (rng.normal(size=(rows, cols)) * gain).astype(np.float32)

    ones = np.ones(H, np.float32)
    tensors = {"token_embd.weight": matrix(s["vocab"], H, 1.0), "output_norm.weight": ones,
               "output.weight": matrix(s["vocab"], H, 1.0)}
    for i in range(s["layers"]):
        shapes = {"attn_q": (H, H), "attn_k": (kv, H), "attn_v": (kv, H), "attn_output": (H, H),
                  "ffn_gate": (s["ffn"], H), "ffn_up": (s["ffn"], H), "ffn_down": (H, s["ffn"])}
        tensors.update({f"blk.{i}.{name}.weight": matrix(*shape, attn_gain if name.startswith("attn") else 0.3)
                        for name, shape in shapes.items()})
        tensors[f"blk.{i}.attn_norm.weight"] = ones
        tensors[f"blk.{i}.ffn_norm.weight"] = ones
    meta = {
        "llama.block_count": s["layers"], "llama.embedding_length": H, "llama.feed_forward_length": s["ffn"],
        "llama.attention.head_count": s["heads"], "llama.attention.head_count_kv": s["kv_heads"],
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 10000.0,
        "llama.context_length": s["context"], "general.name": "tiny block-drafter teacher",
    }
    return write_gguf(path, "llama", meta, tensors)
