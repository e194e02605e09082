"""Checking and laying out the weights of a ``muse-glimmer`` GGUF for the forward.

Every tensor's presence and shape is checked before anything is read. Layout changes:

* Q, K, V and the output gate are one matrix ``wqkvg`` [(2 nh + 2 nkv) hd, H] (one GEMM).
* gate and up are one ``w_gate_up`` [2 F, H].
* The QK-norm weights stay per head-dim vectors; the attention scale 1/sqrt(hd) is folded
  into ``q_norm`` (the file's ``attn_q_norm`` already carries ``qk_scale_factor``).
* Q and K rows keep llama.cpp's per-head permutation (adjacent RoPE pairs): the scaleless
  QK-norm is a per-head RMS, which no permutation inside a head changes.

Block mode (``blocks=True``, the CPU float32 default): every matrix stays in the file's
quantised blocks (``tsspec_gguf.qlinear.BlockMatrix``; Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K), and a
matrix of another type (F32, F16, Q2_K...) rides the same kernel as format-32 blocks, so every
row is computed the same way whatever the row count.

The prepared tensors go through ``tsspec_gguf.cache.WeightCache`` (block matrices flattened
to their ``q``/``d``/``m`` tensors, ``tsspec_gguf.cache.join_block_matrices``
joins them again): a warm load skips packing.
"""

from __future__ import annotations

import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf.cache import join_block_matrices
from tsspec_gguf.qlinear import BlockMatrix, pack_tensors

from .hparams import MuseGlimmerHParams

LAYOUT_TAG = "muse-glimmer-v1"  # bump when the prepared layout changes (invalidates caches)
MATRICES = ("wqkvg", "wo", "w_gate_up", "w_down")
VECTORS = ("attn_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm", "q_norm", "k_norm")


def expected_tensors(hp: MuseGlimmerHParams) -> dict[str, tuple[int, ...]]:
    """name -> numpy-order shape of every tensor the forward reads."""
    H, F, V, hd = hp.hidden_size, hp.ffn_size, hp.vocab_size, hp.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (V, H), "output_norm.weight": (H,), "output.weight": (V, H),
    }
    for i in range(hp.n_layers):
        p = f"blk.{i}."
        shapes.update({
            p + "attn_norm.weight": (H,),
            p + "attn_q.weight": (hp.q_size, H),
            p + "attn_k.weight": (hp.kv_size, H),
            p + "attn_v.weight": (hp.kv_size, H),
            p + "attn_gate.weight": (hp.q_size, H),
            p + "attn_q_norm.weight": (hd,),
            p + "attn_k_norm.weight": (hd,),
            p + "attn_output.weight": (H, hp.q_size),
            p + "post_attention_norm.weight": (H,),
            p + "ffn_norm.weight": (H,),
            p + "ffn_gate.weight": (F, H),
            p + "ffn_up.weight": (F, H),
            p + "ffn_down.weight": (H, F),
            p + "post_ffw_norm.weight": (H,),
        })
    return shapes


def check_tensors(hp: MuseGlimmerHParams, gguf_file) -> None:
    if gguf_file.has_tensor(f"blk.{hp.n_layers}.attn_norm.weight"):
        raise ModelLoadError(gguf_file.path, f"has a layer {hp.n_layers} beyond block_count {hp.n_layers}")
    for name, shape in expected_tensors(hp).items():
        gguf_file.check_tensor(name, shape)


def _matrix(gguf_file, names: list[str], dtype: torch.dtype, blocks: bool):
    """One (fused) matrix: its quantised blocks when every part packs, else its float32 weights
    as format-32 blocks (``blocks``), or dense rows in ``dtype``."""
    if blocks:
        packed = pack_tensors(gguf_file, names)
        if packed is not None:
            return packed
    parts = [gguf_file.tensor(name) for name in names]
    dense = parts[0] if len(parts) == 1 else torch.cat(parts)
    if blocks and dense.shape[-1] % 32 == 0:
        return BlockMatrix.dense(dense)
    return dense.to(dtype)


def prepare_weights(hp: MuseGlimmerHParams, gguf_file, dtype: torch.dtype, blocks: bool) -> dict[str, torch.Tensor]:
    """The forward's tensors as a flat, cacheable dict (block matrices as their parts). Vectors
    are float64 in the float64 reference mode, else float32."""
    vec_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    out: dict[str, torch.Tensor] = {}

    def matrix(key: str, names: list[str]) -> None:
        value = _matrix(gguf_file, names, dtype, blocks)
        out.update(value.tensors(key) if isinstance(value, BlockMatrix) else {key: value})

    def vec(name: str) -> torch.Tensor:
        return gguf_file.tensor(name).to(vec_dtype).contiguous()

    matrix("embed", ["token_embd.weight"])
    matrix("lm_head", ["output.weight"])
    out["output_norm"] = vec("output_norm.weight")
    attn_scale = hp.head_dim**-0.5
    for i in range(hp.n_layers):
        p = f"blk.{i}."
        out[f"l{i}.attn_norm"] = vec(p + "attn_norm.weight")
        out[f"l{i}.post_attn_norm"] = vec(p + "post_attention_norm.weight")
        out[f"l{i}.ffn_norm"] = vec(p + "ffn_norm.weight")
        out[f"l{i}.post_ffn_norm"] = vec(p + "post_ffw_norm.weight")
        out[f"l{i}.q_norm"] = (vec(p + "attn_q_norm.weight") * attn_scale).contiguous()
        out[f"l{i}.k_norm"] = vec(p + "attn_k_norm.weight")
        matrix(f"l{i}.wqkvg", [p + n + ".weight" for n in ("attn_q", "attn_k", "attn_v", "attn_gate")])
        matrix(f"l{i}.wo", [p + "attn_output.weight"])
        matrix(f"l{i}.w_gate_up", [p + "ffn_gate.weight", p + "ffn_up.weight"])
        matrix(f"l{i}.w_down", [p + "ffn_down.weight"])
    return out


def load_weights(
    hp: MuseGlimmerHParams, gguf_file, dtype: torch.dtype, *, blocks: bool, cache=None
) -> dict[str, torch.Tensor | BlockMatrix]:
    """Checked, prepared weights (CPU), through the load cache when given."""
    check_tensors(hp, gguf_file)
    if cache is None:
        return join_block_matrices(prepare_weights(hp, gguf_file, dtype, blocks))
    from tsspec_gguf.cache import cache_key

    key = cache_key(gguf_file, f"{LAYOUT_TAG}-{'blocks' if blocks else 'dense'}", dtype)
    return join_block_matrices(cache.load_or_build(key, lambda: prepare_weights(hp, gguf_file, dtype, blocks)))
