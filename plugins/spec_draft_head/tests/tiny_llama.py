"""A tiny random llama GGUF (no tokenizer) for the trainer tests: fast to load and to train on."""

from __future__ import annotations

import numpy as np

VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, CONTEXT = 96, 32, 48, 2, 4, 2, 512


def write_tiny_llama(path, seed: int = 0) -> str:
    from tsspec.modeling.gguf_writer_util import write_gguf

    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.3):
        return (rng.normal(size=shape) * scale).astype(np.float32)

    kv = KV_HEADS * HIDDEN // HEADS
    meta = {
        "llama.block_count": LAYERS,
        "llama.embedding_length": HIDDEN,
        "llama.feed_forward_length": FFN,
        "llama.attention.head_count": HEADS,
        "llama.attention.head_count_kv": KV_HEADS,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.freq_base": 10000.0,
        "llama.context_length": CONTEXT,
        "general.name": "tiny drafter-training target",
    }
    tensors = {"token_embd.weight": w(VOCAB, HIDDEN, scale=1.0), "output_norm.weight": np.ones(HIDDEN, np.float32),
               "output.weight": w(VOCAB, HIDDEN, scale=1.0)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        tensors.update({
            p + "attn_norm.weight": np.ones(HIDDEN, np.float32),
            p + "attn_q.weight": w(HIDDEN, HIDDEN),
            p + "attn_k.weight": w(kv, HIDDEN),
            p + "attn_v.weight": w(kv, HIDDEN),
            p + "attn_output.weight": w(HIDDEN, HIDDEN),
            p + "ffn_norm.weight": np.ones(HIDDEN, np.float32),
            p + "ffn_gate.weight": w(FFN, HIDDEN),
            p + "ffn_up.weight": w(FFN, HIDDEN),
            p + "ffn_down.weight": w(HIDDEN, FFN),
        })
    return write_gguf(path, "llama", meta, tensors)
