"""Checking and laying out the weights of a ``muse-glimmer`` GGUF for the forward.

Every tensor's presence and shape is checked before anything is read. Layout changes:

* Q, K, V and the output gate are one matrix ``wqkvg`` [(2 nh + 2 nkv) hd, H] (one GEMM).
* gate and up are one ``w_gate_up`` [2 F, H].
* The QK-norm weights stay per head-dim vectors; the attention scale 1/sqrt(hd) is folded
  into ``q_norm`` (the file's ``attn_q_norm`` already carries ``qk_scale_factor``).
* Q and K rows keep llama.cpp's per-head permutation (adjacent RoPE pairs): the scaleless
  QK-norm is a per-head RMS, which no permutation inside a head changes.

Block mode (``blocks=True``, the CPU float32 default): every matrix stays in the file's
quantised blocks (``tsspec.modeling.qlinear.BlockMatrix``; Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K), and a
matrix of another type (F32, F16, Q2_K...) rides the same kernel as format-32 blocks, so every
row is computed the same way whatever the row count.
"""

from __future__ import annotations

import torch

from tsspec.errors import ModelLoadError
from tsspec.modeling.qlinear import BlockMatrix, pack_tensors

from .hparams import MuseGlimmerHParams

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


def load_weights(
    hp: MuseGlimmerHParams, gguf_file, dtype: torch.dtype, *, blocks: bool
) -> dict[str, torch.Tensor | BlockMatrix]:
    """Checked, prepared weights (CPU). ``dtype`` is the dense matrices' dtype; vectors are
    float64 in the float64 reference mode, else float32."""
    check_tensors(hp, gguf_file)
    vec_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    def vec(name: str) -> torch.Tensor:
        return gguf_file.tensor(name).to(vec_dtype).contiguous()

    out: dict[str, torch.Tensor | BlockMatrix] = {
        "embed": _matrix(gguf_file, ["token_embd.weight"], dtype, blocks),
        "lm_head": _matrix(gguf_file, ["output.weight"], dtype, blocks),
        "output_norm": vec("output_norm.weight"),
    }
    attn_scale = hp.head_dim**-0.5
    for i in range(hp.n_layers):
        p = f"blk.{i}."
        out[f"l{i}.attn_norm"] = vec(p + "attn_norm.weight")
        out[f"l{i}.post_attn_norm"] = vec(p + "post_attention_norm.weight")
        out[f"l{i}.ffn_norm"] = vec(p + "ffn_norm.weight")
        out[f"l{i}.post_ffn_norm"] = vec(p + "post_ffw_norm.weight")
        out[f"l{i}.q_norm"] = (vec(p + "attn_q_norm.weight") * attn_scale).contiguous()
        out[f"l{i}.k_norm"] = vec(p + "attn_k_norm.weight")
        qkvg = [p + n + ".weight" for n in ("attn_q", "attn_k", "attn_v", "attn_gate")]
        out[f"l{i}.wqkvg"] = _matrix(gguf_file, qkvg, dtype, blocks)
        out[f"l{i}.wo"] = _matrix(gguf_file, [p + "attn_output.weight"], dtype, blocks)
        out[f"l{i}.w_gate_up"] = _matrix(gguf_file, [p + "ffn_gate.weight", p + "ffn_up.weight"], dtype, blocks)
        out[f"l{i}.w_down"] = _matrix(gguf_file, [p + "ffn_down.weight"], dtype, blocks)
    return out
