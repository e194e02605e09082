"""Checking, dequantising and laying out the weights of a llama GGUF for a fast forward.

Every tensor's presence and shape is checked before anything is read, so a bad file fails in
milliseconds with the tensor's name. The layout the forward wants differs from the file's:

* Q, K and V are one matrix ``wqkv`` [(n_heads + 2 n_kv) * hd, H]; gate and up are one
  ``w_gate_up`` [2 F, H]: one GEMM instead of three (two) per layer.
* The attention scale 1/sqrt(hd) is folded into the Q rows (one multiply fewer per layer).
* Q and K keep llama.cpp's per-head row permutation (adjacent RoPE pairs, see rope.py).
* Tied embeddings (no ``output.weight``) share one tensor for the embedding and the LM head.

The prepared tensors go through ``tsspec.modeling.cache.WeightCache``; a warm load maps them back.
"""

from __future__ import annotations

from typing import Iterator

import torch

from tsspec.errors import ModelLoadError

from .hparams import LlamaHParams

LAYOUT_TAG = "llama-fused-v2"  # bump when the prepared layout changes (invalidates caches)


def residual_dtype(dtype: torch.dtype) -> torch.dtype:
    """The residual stream and norms stay float32 whatever the matmul dtype (float64 for the
    float64 reference mode)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def expected_tensors(hp: LlamaHParams, gguf_file) -> dict[str, tuple[int, ...]]:
    """name -> numpy-order shape of every tensor the forward reads (optional ones if present)."""
    H, F, V = hp.hidden_size, hp.ffn_size, hp.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    if gguf_file.has_tensor("output.weight"):
        shapes["output.weight"] = (V, H)
    if gguf_file.has_tensor("rope_freqs.weight"):
        shapes["rope_freqs.weight"] = (hp.rope_dim // 2,)
    for i in range(hp.n_layers):
        p = f"blk.{i}."
        shapes.update(
            {
                p + "attn_norm.weight": (H,),
                p + "attn_q.weight": (hp.q_size, H),
                p + "attn_k.weight": (hp.kv_size, H),
                p + "attn_v.weight": (hp.kv_size, H),
                p + "attn_output.weight": (H, hp.q_size),
                p + "ffn_norm.weight": (H,),
                p + "ffn_gate.weight": (F, H),
                p + "ffn_up.weight": (F, H),
                p + "ffn_down.weight": (H, F),
            }
        )
        for name, size in (("attn_q", hp.q_size), ("attn_k", hp.kv_size), ("attn_v", hp.kv_size), ("attn_output", H)):
            if gguf_file.has_tensor(p + name + ".bias"):
                shapes[p + name + ".bias"] = (size,)
    return shapes


def check_tensors(hp: LlamaHParams, gguf_file) -> dict[str, tuple[int, ...]]:
    """Presence and shape of every tensor, and no unexpected kind of layer (e.g. MoE)."""
    if gguf_file.has_tensor("blk.0.ffn_gate_inp.weight"):
        raise ModelLoadError(gguf_file.path, "mixture-of-experts llama files are not supported by this plugin")
    if gguf_file.has_tensor(f"blk.{hp.n_layers}.attn_norm.weight"):
        raise ModelLoadError(
            gguf_file.path, f"has a layer {hp.n_layers} beyond block_count {hp.n_layers}"
        )
    shapes = expected_tensors(hp, gguf_file)
    for name, shape in shapes.items():
        gguf_file.check_tensor(name, shape)
    return shapes


def _layer_tensors(hp: LlamaHParams, gguf_file, i: int, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    p = f"blk.{i}."

    def load(name: str) -> torch.Tensor:
        return gguf_file.tensor(p + name)  # float32

    scale = hp.head_dim**-0.5  # the attention scale, folded into Q (exact for hd = 4^k)
    q, k = load("attn_q.weight") * scale, load("attn_k.weight")
    norm_dtype = residual_dtype(dtype)
    yield f"l{i}.attn_norm", load("attn_norm.weight").to(norm_dtype)
    yield f"l{i}.wqkv", torch.cat([q, k, load("attn_v.weight")]).to(dtype)
    if gguf_file.has_tensor(p + "attn_q.bias"):
        yield f"l{i}.bqkv", torch.cat([load("attn_q.bias") * scale, load("attn_k.bias"), load("attn_v.bias")]).to(dtype)
    yield f"l{i}.wo", load("attn_output.weight").to(dtype)
    if gguf_file.has_tensor(p + "attn_output.bias"):
        yield f"l{i}.bo", load("attn_output.bias").to(dtype)
    yield f"l{i}.ffn_norm", load("ffn_norm.weight").to(norm_dtype)
    yield f"l{i}.w_gate_up", torch.cat([load("ffn_gate.weight"), load("ffn_up.weight")]).to(dtype)
    yield f"l{i}.w_down", load("ffn_down.weight").to(dtype)


def prepare_weights(hp: LlamaHParams, gguf_file, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The forward's tensors (see the module docstring), all on the CPU."""
    out: dict[str, torch.Tensor] = {
        "embed": gguf_file.tensor("token_embd.weight").to(dtype),
        "output_norm": gguf_file.tensor("output_norm.weight").to(residual_dtype(dtype)),
    }
    if gguf_file.has_tensor("output.weight"):
        out["lm_head"] = gguf_file.tensor("output.weight").to(dtype)
    if gguf_file.has_tensor("rope_freqs.weight"):
        out["rope_freqs"] = gguf_file.tensor("rope_freqs.weight").to(torch.float32)
    for i in range(hp.n_layers):
        out.update(_layer_tensors(hp, gguf_file, i, dtype))
    return out


def load_weights(hp: LlamaHParams, gguf_file, dtype: torch.dtype, cache=None) -> dict[str, torch.Tensor]:
    """Checked, prepared weights, through the load cache when one is given."""
    check_tensors(hp, gguf_file)
    if cache is None:
        return prepare_weights(hp, gguf_file, dtype)
    from tsspec.modeling.cache import cache_key

    key = cache_key(gguf_file, LAYOUT_TAG, dtype)
    return cache.load_or_build(key, lambda: prepare_weights(hp, gguf_file, dtype))
