"""Random-weight DFlash / DFlash2 drafter files, for tests and the benchmark.

A random drafter proposes nonsense, which is exactly what losslessness and cost measurements
need: every draft is verified, so output must equal plain decoding whatever it proposes, and the
cost of a drafter pass does not depend on its weights. ``write_random_dflash`` writes a file with
the same keys and tensor names a converted checkpoint has::

    write_random_dflash("d.gguf", hidden_size=576, target_layers=[2, 15, 29],
                        vocab_size=49152, mask_token_id=0, num_layers=1, block_size=16)
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .converter import write_gguf

__all__ = ["random_dflash_tensors", "random_dflash_metadata", "write_random_dflash"]


def random_dflash_metadata(
    *,
    hidden_size: int,
    target_layers: Sequence[int],
    mask_token_id: int,
    num_layers: int = 1,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int | None = None,
    ffn_size: int | None = None,
    block_size: int = 16,
    sliding_window: int | None = 64,
    target_hidden_size: int | None = None,
    conv: tuple[int, int] | None = None,  # (kernel size, group size): DFlash2 conv
    selector: tuple[int, int] | None = None,  # (rank, top k): DFlash2 selector
    logit_scale: float | None = None,
    softcap: float | None = None,
    vocab_size: int | None = None,
    rope_base: float = 10000.0,
    eps: float = 2.0**-20,
) -> dict:
    """The ``dflash.*`` metadata (keys without the prefix) of a random drafter."""
    head_dim = head_dim or hidden_size // n_head
    meta: dict = {
        "block_count": num_layers,
        "embedding_length": hidden_size,
        "feed_forward_length": ffn_size or 2 * hidden_size,
        "attention.head_count": n_head,
        "attention.head_count_kv": n_head_kv,
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "rope.freq_base": float(rope_base),
        "attention.layer_norm_rms_epsilon": float(eps),
        "block_size": block_size,
        "target_layers": [int(v) for v in target_layers],
        "target_hidden_size": target_hidden_size or hidden_size,
        "__mask_token_id__": int(mask_token_id),
    }
    if sliding_window:
        meta["attention.sliding_window"] = int(sliding_window)
        meta["attention.sliding_window_pattern"] = [True] * num_layers
    if conv:
        meta["conv_kernel_size"], meta["conv_group_size"] = int(conv[0]), int(conv[1])
    if selector:
        meta["selector_rank"], meta["selector_top_k"] = int(selector[0]), int(selector[1])
    if logit_scale is not None:
        meta["logit_scale"] = float(logit_scale)
    if softcap is not None:
        meta["final_logit_softcapping"] = float(softcap)
    if vocab_size is not None:
        meta["vocab_size"] = int(vocab_size)
    return meta


def random_dflash_tensors(meta: dict, *, selector_vocab: int | None = None, seed: int = 0,
                          scale: float = 0.5) -> dict[str, np.ndarray]:
    """Random tensors for ``meta`` (numpy order). Linear weights ~ N(0, scale^2 / fan_in)."""
    rng = np.random.default_rng(seed)
    H, F = meta["embedding_length"], meta["feed_forward_length"]
    nh, nkv, hd = meta["attention.head_count"], meta["attention.head_count_kv"], meta["attention.key_length"]
    taps = len(meta["target_layers"]) * meta["target_hidden_size"]

    def lin(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) * scale / np.sqrt(inp)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tensors = {"fc.weight": lin(H, taps), "enc.output_norm.weight": norm(H), "output_norm.weight": norm(H)}
    for i in range(meta["block_count"]):
        p = f"blk.{i}."
        tensors.update({
            p + "attn_norm.weight": norm(H), p + "attn_q.weight": lin(nh * hd, H),
            p + "attn_k.weight": lin(nkv * hd, H), p + "attn_v.weight": lin(nkv * hd, H),
            p + "attn_output.weight": lin(H, nh * hd), p + "attn_q_norm.weight": norm(hd),
            p + "attn_k_norm.weight": norm(hd), p + "ffn_norm.weight": norm(H),
            p + "ffn_gate.weight": lin(F, H), p + "ffn_up.weight": lin(F, H), p + "ffn_down.weight": lin(H, F),
        })
        if "conv_kernel_size" in meta:
            K, G = meta["conv_kernel_size"], H // meta["conv_group_size"]
            for side in ("attn_conv", "ffn_conv"):
                base = 0.3 * rng.standard_normal((2, K, H))
                base[:, 0] += 1.0  # near-identity filters keep random activations in range
                tensors[p + f"{side}_base.weight"] = base.astype(np.float32)
                tensors[p + f"{side}_proj.weight"] = lin(2 * K * G, H) * 0.3
    if "selector_rank" in meta:
        if selector_vocab is None:
            raise ValueError("a selector needs the target's vocabulary size (selector_vocab)")
        r = meta["selector_rank"]
        tensors["selector_hidden.weight"] = lin(r, H)
        tensors["selector_predecessor.weight"] = rng.standard_normal((selector_vocab, r)).astype(np.float32)
        tensors["selector_successor.weight"] = (rng.standard_normal((selector_vocab, r)) / np.sqrt(r)).astype(np.float32)
    return tensors


def write_random_dflash(path: str | Path, *, seed: int = 0, selector_vocab: int | None = None,
                        out_type: str = "f32", **meta_args) -> Path:
    """Write a random drafter GGUF; ``meta_args`` go to ``random_dflash_metadata``."""
    meta = random_dflash_metadata(**meta_args)
    if selector_vocab is None and meta_args.get("selector"):
        selector_vocab = meta_args.get("vocab_size")
    tensors = random_dflash_tensors(meta, selector_vocab=selector_vocab, seed=seed)
    write_gguf(path, meta, tensors, out_type=out_type, name="random dflash drafter")
    return Path(path)
