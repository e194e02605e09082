"""Random Qwen 3.5 models in memory, in GGUF layout: for benchmarks that need a model slow
enough to measure without a checkpoint (or a GGUF file) on disk.

``random_model(SyntheticSpec(...))`` returns ``(arch, metadata, tensors)`` exactly as the
converter does, so ``load_from_source(MemorySource(*random_model(spec)))`` goes through the same
loader a GGUF file does. Weights are scaled so activations stay O(1) through the layers (linear
weights ``1/sqrt(fan_in)``, norms near 1, decays in a useful range); the outputs mean nothing.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np
import torch


@attrs.frozen
class SyntheticSpec:
    """Dimensions of a random dense qwen35 model (defaults: a mid-size one, ~0.14 B params)."""

    vocab_size: int = 16384
    hidden_size: int = 1024
    num_layers: int = 8
    full_attention_interval: int = 4
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 128
    rope_dims: int = 32
    num_k_heads: int = 8
    num_v_heads: int = 16
    head_k_dim: int = 128
    head_v_dim: int = 128
    conv_kernel: int = 4
    ffn_size: int = 3072
    nextn: bool = False
    context_length: int = 4096


def random_model(spec: SyntheticSpec = SyntheticSpec(), seed: int = 0) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """(arch, metadata, tensors) of a random ``qwen35`` model in llama.cpp's layout."""
    g = torch.Generator().manual_seed(seed)
    s = spec
    H = s.hidden_size

    def linear(out_dim: int, in_dim: int) -> torch.Tensor:
        return torch.randn(out_dim, in_dim, generator=g) / math.sqrt(in_dim)

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    key_dim, value_dim = s.num_k_heads * s.head_k_dim, s.num_v_heads * s.head_v_dim
    tensors: dict[str, torch.Tensor] = {
        "token_embd.weight": torch.randn(s.vocab_size, H, generator=g),
        "output_norm.weight": norm(H),
        "output.weight": linear(s.vocab_size, H),
    }

    def attention(p: str) -> None:
        tensors[f"{p}.attn_q.weight"] = linear(s.num_heads * 2 * s.head_dim, H)
        tensors[f"{p}.attn_k.weight"] = linear(s.num_kv_heads * s.head_dim, H)
        tensors[f"{p}.attn_v.weight"] = linear(s.num_kv_heads * s.head_dim, H)
        tensors[f"{p}.attn_output.weight"] = linear(H, s.num_heads * s.head_dim)
        tensors[f"{p}.attn_q_norm.weight"] = norm(s.head_dim)
        tensors[f"{p}.attn_k_norm.weight"] = norm(s.head_dim)

    def block(i: int, recurrent: bool) -> None:
        p = f"blk.{i}"
        tensors[f"{p}.attn_norm.weight"] = norm(H)
        tensors[f"{p}.post_attention_norm.weight"] = norm(H)
        if recurrent:
            tensors[f"{p}.attn_qkv.weight"] = linear(2 * key_dim + value_dim, H)
            tensors[f"{p}.attn_gate.weight"] = linear(value_dim, H)
            tensors[f"{p}.ssm_beta.weight"] = linear(s.num_v_heads, H)
            tensors[f"{p}.ssm_alpha.weight"] = linear(s.num_v_heads, H)
            tensors[f"{p}.ssm_conv1d.weight"] = linear(2 * key_dim + value_dim, s.conv_kernel)
            tensors[f"{p}.ssm_dt.bias"] = 0.5 * torch.randn(s.num_v_heads, generator=g)
            tensors[f"{p}.ssm_a"] = -torch.empty(s.num_v_heads).uniform_(0.3, 3.0, generator=g)
            tensors[f"{p}.ssm_norm.weight"] = norm(s.head_v_dim)
            tensors[f"{p}.ssm_out.weight"] = linear(H, value_dim)
        else:
            attention(p)
        tensors[f"{p}.ffn_gate.weight"] = linear(s.ffn_size, H)
        tensors[f"{p}.ffn_up.weight"] = linear(s.ffn_size, H)
        tensors[f"{p}.ffn_down.weight"] = linear(H, s.ffn_size)

    for i in range(s.num_layers):
        block(i, (i + 1) % s.full_attention_interval != 0)
    if s.nextn:
        L = s.num_layers
        block(L, recurrent=False)
        tensors[f"blk.{L}.nextn.eh_proj.weight"] = linear(H, 2 * H)
        for name in ("enorm", "hnorm", "shared_head_norm"):
            tensors[f"blk.{L}.nextn.{name}.weight"] = norm(H)
    arch = "qwen35"
    meta: dict[str, Any] = {
        f"{arch}.context_length": s.context_length,
        f"{arch}.embedding_length": H,
        f"{arch}.block_count": s.num_layers + int(s.nextn),
        f"{arch}.feed_forward_length": s.ffn_size,
        f"{arch}.attention.head_count": s.num_heads,
        f"{arch}.attention.head_count_kv": s.num_kv_heads,
        f"{arch}.attention.key_length": s.head_dim,
        f"{arch}.attention.value_length": s.head_dim,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.rope.freq_base": 10_000_000.0,
        f"{arch}.rope.dimension_count": s.rope_dims,
        f"{arch}.ssm.conv_kernel": s.conv_kernel,
        f"{arch}.ssm.state_size": s.head_k_dim,
        f"{arch}.ssm.group_count": s.num_k_heads,
        f"{arch}.ssm.time_step_rank": s.num_v_heads,
        f"{arch}.ssm.inner_size": value_dim,
        f"{arch}.full_attention_interval": s.full_attention_interval,
    }
    if s.nextn:
        meta[f"{arch}.nextn_predict_layers"] = 1
    return arch, meta, tensors


def parameter_count(tensors: dict[str, Any]) -> int:
    return int(sum(np.prod(t.shape) for t in tensors.values()))
