"""Checking, dequantising and laying out the weights of a llama GGUF for a fast forward.

Every tensor's presence and shape is checked before anything is read, so a bad file fails in
milliseconds with the tensor's name. The layout the forward wants differs from the file's:

* Q, K and V are one matrix ``wqkv`` [(n_heads + 2 n_kv) * hd, H]; gate and up are one
  ``w_gate_up`` [2 F, H]: one GEMM instead of three (two) per layer.
* The attention scale 1/sqrt(hd) is folded into the Q rows (one multiply fewer per layer).
* Q and K keep llama.cpp's per-head row permutation (adjacent RoPE pairs, see rope.py).
* Tied embeddings (no ``output.weight``) share one tensor for the embedding and the LM head.

Block mode (``blocks=True``, the CPU default): the matrices stay in the file's quantised blocks
(``tsspec_gguf.qlinear.BlockMatrix``: Q4_0, Q4_1, Q8_0) and are stored as their ``q``/``d``/``m``
tensors under the matrix's name (``l3.wqkv.q4``, ``l3.wqkv.d``, ...); a matrix of another type
stays dense float32. ``tsspec_gguf.cache.join_block_matrices`` turns the flat dict back
into tensors and BlockMatrix objects.

The prepared tensors go through ``tsspec_gguf.cache.WeightCache``; a warm load maps them back.
"""

from __future__ import annotations

from typing import Iterator

import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf.cache import join_block_matrices
from tsspec_gguf.qlinear import BlockMatrix, pack_tensors

from .hparams import LlamaHParams

LAYOUT_TAG = "llama-fused-v2"  # bump when the prepared layout changes (invalidates caches)
BLOCK_LAYOUT_TAG = "llama-blocks-v3"  # v2: K-quants (formats 4, 8, 16); v3: format 32
MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")  # per-layer names that may be BlockMatrix


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


def _matrix(gguf_file, key: str, names: list[str], scales: list[float], dtype: torch.dtype, blocks: bool):
    """(key, tensor) pairs of one (fused) matrix: with ``blocks``, its quantised blocks when every
    part is a type the block kernel takes, else its float32 weights as format-32 blocks (so every
    matrix runs on the row-invariant kernel); without, the dense rows in ``dtype``."""
    if blocks:
        packed = pack_tensors(gguf_file, names, scales)
        if packed is not None:
            return list(packed.tensors(key).items())
    parts = [gguf_file.tensor(name) * s if s != 1.0 else gguf_file.tensor(name) for name, s in zip(names, scales)]
    dense = parts[0] if len(parts) == 1 else torch.cat(parts)
    if blocks and dense.shape[-1] % 32 == 0:
        return list(BlockMatrix.dense(dense).tensors(key).items())
    return [(key, dense.to(dtype))]


def _layer_tensors(
    hp: LlamaHParams, gguf_file, i: int, dtype: torch.dtype, blocks: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    p = f"blk.{i}."

    def load(name: str) -> torch.Tensor:
        return gguf_file.tensor(p + name)  # float32

    scale = hp.head_dim**-0.5  # the attention scale, folded into Q (exact for hd = 4^k)
    norm_dtype = residual_dtype(dtype)
    yield f"l{i}.attn_norm", load("attn_norm.weight").to(norm_dtype)
    qkv = [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
    yield from _matrix(gguf_file, f"l{i}.wqkv", qkv, [scale, 1.0, 1.0], dtype, blocks)
    if gguf_file.has_tensor(p + "attn_q.bias"):
        yield f"l{i}.bqkv", torch.cat([load("attn_q.bias") * scale, load("attn_k.bias"), load("attn_v.bias")]).to(dtype)
    yield from _matrix(gguf_file, f"l{i}.wo", [p + "attn_output.weight"], [1.0], dtype, blocks)
    if gguf_file.has_tensor(p + "attn_output.bias"):
        yield f"l{i}.bo", load("attn_output.bias").to(dtype)
    yield f"l{i}.ffn_norm", load("ffn_norm.weight").to(norm_dtype)
    gate_up = [p + "ffn_gate.weight", p + "ffn_up.weight"]
    yield from _matrix(gguf_file, f"l{i}.w_gate_up", gate_up, [1.0, 1.0], dtype, blocks)
    yield from _matrix(gguf_file, f"l{i}.w_down", [p + "ffn_down.weight"], [1.0], dtype, blocks)


def prepare_weights(hp: LlamaHParams, gguf_file, dtype: torch.dtype, blocks: bool = False) -> dict[str, torch.Tensor]:
    """The forward's tensors (see the module docstring), all on the CPU."""
    out: dict[str, torch.Tensor] = dict(_matrix(gguf_file, "embed", ["token_embd.weight"], [1.0], dtype, blocks))
    out["output_norm"] = gguf_file.tensor("output_norm.weight").to(residual_dtype(dtype))
    if gguf_file.has_tensor("output.weight"):
        out.update(_matrix(gguf_file, "lm_head", ["output.weight"], [1.0], dtype, blocks))
    if gguf_file.has_tensor("rope_freqs.weight"):
        out["rope_freqs"] = gguf_file.tensor("rope_freqs.weight").to(torch.float32)
    for i in range(hp.n_layers):
        out.update(_layer_tensors(hp, gguf_file, i, dtype, blocks))
    return out


def load_weights(
    hp: LlamaHParams, gguf_file, dtype: torch.dtype, cache=None, *, blocks: bool = False
) -> dict[str, torch.Tensor | BlockMatrix]:
    """Checked, prepared weights (block matrices joined), through the load cache when given."""
    check_tensors(hp, gguf_file)
    if cache is None:
        return join_block_matrices(prepare_weights(hp, gguf_file, dtype, blocks))
    from tsspec_gguf.cache import cache_key

    key = cache_key(gguf_file, BLOCK_LAYOUT_TAG if blocks else LAYOUT_TAG, dtype)
    return join_block_matrices(cache.load_or_build(key, lambda: prepare_weights(hp, gguf_file, dtype, blocks)))
