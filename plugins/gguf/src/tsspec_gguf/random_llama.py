"""A small random llama GGUF for tests that need a real file (float32, no tokenizer)."""

from __future__ import annotations

__all__ = ["write_random_llama"]


def write_random_llama(path, *, vocab: int, hidden: int, ffn: int, layers: int, heads: int, kv_heads: int,
                       context: int = 512, seed: int = 0, attn_gain: float = 0.3,
                       name: str = "random llama") -> str:
    """A small random llama GGUF (float32, no tokenizer) for tests that need a real file: the
    embedding and output rows drawn N(0, 1), the attention matrices N(0, ``attn_gain``^2)
    (a small gain makes the next token depend mostly on the current one), the FFN N(0, 0.09),
    unit norms. Returns the path."""
    import numpy as np

    from .gguf_writer import write_gguf

    rng = np.random.default_rng(seed)
    kv = kv_heads * hidden // heads

    def matrix(rows: int, cols: int, gain: float) -> np.ndarray:
        return (rng.normal(size=(rows, cols)) * gain).astype(np.float32)

    ones = np.ones(hidden, np.float32)
    tensors = {"token_embd.weight": matrix(vocab, hidden, 1.0), "output_norm.weight": ones,
               "output.weight": matrix(vocab, hidden, 1.0)}
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden),
              "attn_output": (hidden, hidden), "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden),
              "ffn_down": (hidden, ffn)}
    for i in range(layers):
        tensors[f"blk.{i}.attn_norm.weight"] = ones
        tensors[f"blk.{i}.ffn_norm.weight"] = ones
        for part, shape in shapes.items():  # one draw per matrix, in this order
            tensors[f"blk.{i}.{part}.weight"] = matrix(*shape, attn_gain if part.startswith("attn") else 0.3)
    meta = {
        "llama.block_count": layers, "llama.embedding_length": hidden, "llama.feed_forward_length": ffn,
        "llama.attention.head_count": heads, "llama.attention.head_count_kv": kv_heads,
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 10000.0,
        "llama.context_length": context, "general.name": name,
    }
    return write_gguf(path, "llama", meta, tensors)

