"""A tiny random qwen3 GGUF and a NextN head trained on it by ``train-drafter --kind mtp``'s
trainer over the whole vocabulary (so the head has q/k norms and borrows the target's LM head:
the shape speculators' mtp type takes); shared by the round-trip test and make interop-check."""

from __future__ import annotations

import random

import numpy as np
import torch

VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 80, 32, 48, 2, 4, 2, 8


def write_tiny_qwen3(path, seed: int = 0) -> str:
    """A tiny random qwen3 GGUF (float32, no tokenizer): per-head q/k norms in every layer."""
    from tsspec_gguf.gguf_writer import write_gguf

    rng = np.random.default_rng(seed)

    def draw(*shape, gain=1.0):
        return (rng.normal(size=shape) * gain).astype(np.float32)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    tensors = {"token_embd.weight": draw(VOCAB, HIDDEN), "output_norm.weight": np.ones(HIDDEN, np.float32),
               "output.weight": draw(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        tensors.update({
            f"blk.{i}.attn_norm.weight": np.ones(HIDDEN, np.float32),
            f"blk.{i}.ffn_norm.weight": np.ones(HIDDEN, np.float32),
            f"blk.{i}.attn_q.weight": draw(q, HIDDEN, gain=0.3), f"blk.{i}.attn_k.weight": draw(kv, HIDDEN, gain=0.3),
            f"blk.{i}.attn_v.weight": draw(kv, HIDDEN, gain=0.3), f"blk.{i}.attn_output.weight": draw(HIDDEN, q, gain=0.3),
            f"blk.{i}.attn_q_norm.weight": 1.0 + draw(HEAD_DIM, gain=0.2),
            f"blk.{i}.attn_k_norm.weight": 1.0 + draw(HEAD_DIM, gain=0.2),
            f"blk.{i}.ffn_gate.weight": draw(FFN, HIDDEN, gain=0.3), f"blk.{i}.ffn_up.weight": draw(FFN, HIDDEN, gain=0.3),
            f"blk.{i}.ffn_down.weight": draw(HIDDEN, FFN, gain=0.3),
        })
    meta = {"qwen3.block_count": LAYERS, "qwen3.embedding_length": HIDDEN, "qwen3.feed_forward_length": FFN,
            "qwen3.attention.head_count": HEADS, "qwen3.attention.head_count_kv": KV_HEADS,
            "qwen3.attention.key_length": HEAD_DIM, "qwen3.attention.value_length": HEAD_DIM,
            "qwen3.attention.layer_norm_rms_epsilon": 1e-6, "qwen3.rope.freq_base": 10000.0,
            "qwen3.context_length": 512, "general.name": "tiny qwen3"}
    return write_gguf(path, "qwen3", meta, tensors)


def train_tiny_head(folder) -> tuple[str, str]:
    """(target file, head file) in ``folder``: a tiny qwen3 and a head trained on its own greedy
    continuations (12 steps, one torch thread)."""
    from pathlib import Path

    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions
    from tsspec_draft_head.trainer import train_mtp
    from tsspec_gguf.identity import identify
    from tsspec_training.dataset import DataSpec
    from tsspec_training.loop import LoopSpec
    from tsspec_training.request import TrainRequest
    from tsspec_training.teacher import greedy_answer

    folder = Path(folder)
    model = write_tiny_qwen3(folder / "tiny-qwen3.gguf")
    target = load_model(model, options=SpeculationOptions(enabled=False))
    rng = random.Random(0)
    sequences = [tuple(p + greedy_answer(target, p, 28)) for p in ([rng.randrange(VOCAB) for _ in range(4)]
                                                                   for _ in range(12))]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        request = TrainRequest(
            model_path=model, out_path=str(folder / "head.gguf"), kind="mtp",
            data=DataSpec(seq_len=32, soft_k=4, cache_dir=str(folder / "cache"), sequences=tuple(sequences)),
            loop=LoopSpec(steps=12, lr=3e-3, warmup=2, seed=0, device="cpu", checkpoint=str(folder / "ckpt.pt"),
                          checkpoint_every=100, log_every=0),
            identity=identify(model).to_json(), draft_vocab=VOCAB, unroll=2, batch=4, valid_share=0.0,
            outtype="f32",
        )
        summary = train_mtp(request, target, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    return model, summary["path"]


def prompts(n=20):
    rng = np.random.default_rng(5)
    return [[int(t) for t in rng.integers(0, VOCAB, size=int(rng.integers(3, 10)))] for _ in range(n)]


def chain(target, prompt, steps=4):
    """The head's greedy chain after ``prompt``, as draft-head runs it: the head catches up on
    the prompt (token p with the trunk row of p - 1), then drafts after the target's next token
    (fed with the trunk row that predicted it) and chains on its own output rows."""
    target.spec_rewind_cache(0)
    head = target.draft_head.for_sequence()
    logits, rows = target.spec_forward(prompt, all_logits_rows=True, want_hidden=True)  # [n, V], [n, H]
    predecessors = torch.cat([torch.zeros_like(rows[:1]), rows[:-1]])  # row k predicted token k
    head.draft_catch_up(prompt, predecessors, 0)
    n = len(prompt)
    drafts, (logits, out) = [], head.draft_step(int(torch.argmax(logits[-1])), rows[-1], n)
    for step in range(steps):
        drafts.append(int(torch.argmax(logits)))
        logits, out = head.draft_step(drafts[-1], out, n + 1 + step)
    return drafts
