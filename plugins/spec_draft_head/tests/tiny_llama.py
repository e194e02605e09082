"""A tiny random llama GGUF (no tokenizer) for the trainer tests: fast to load and to train on."""

from __future__ import annotations

VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, CONTEXT = 96, 32, 48, 2, 4, 2, 512


def write_tiny_llama(path, seed: int = 0) -> str:
    from tsspec_gguf.random_llama import write_random_llama

    return write_random_llama(path, vocab=VOCAB, hidden=HIDDEN, ffn=FFN, layers=LAYERS, heads=HEADS,
                              kv_heads=KV_HEADS, context=CONTEXT, seed=seed, name="tiny drafter-training target")
