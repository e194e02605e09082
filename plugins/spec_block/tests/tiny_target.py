"""A tiny random llama written as a GGUF (no tokenizer): the teacher of the trainer tests.

Three layers so that taps can sit at different depths; 128 tokens so that a draft vocabulary
is a real subset; everything else as small as the llama path allows. Attention is weak
(``attn_gain``): the next token depends mostly on the current one and a little on the context,
so a few dozen optimiser steps can learn something a random model does."""

from __future__ import annotations

SHAPE = dict(vocab=128, hidden=32, ffn=64, layers=3, heads=4, kv_heads=2, context=512)


def write_tiny_target(path, seed: int = 0, attn_gain: float = 0.1) -> str:
    from tsspec_gguf.random_llama import write_random_llama

    return write_random_llama(path, **SHAPE, seed=seed, attn_gain=attn_gain, name="tiny block-drafter teacher")
