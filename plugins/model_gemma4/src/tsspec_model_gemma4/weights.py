"""Checking and reading the weights of a ``gemma4`` / ``gemma4-assistant`` GGUF.

Per layer (llama.cpp's names): ``attn_norm``, ``attn_q``, ``attn_q_norm``, ``attn_k`` /
``attn_k_norm`` (absent on KV-shared layers), ``attn_v`` (absent on full layers with
``attention_k_eq_v``: V is the raw K projection), ``attn_output``, ``post_attention_norm``,
``ffn_norm``, ``ffn_gate`` / ``ffn_up`` / ``ffn_down``, ``post_ffw_norm``,
``layer_output_scale``; per-layer inputs ``inp_gate``, ``proj``, ``post_norm``; MoE
``ffn_gate_inp`` (router, ``.weight`` and ``.scale``), ``ffn_gate_up_exps``, ``ffn_down_exps``
(``.weight`` and the per-expert ``.scale``), ``pre_ffw_norm_2``, ``post_ffw_norm_1`` / ``_2``.
Norm weights are plain ``w`` (Gemma 4's RMSNorm has no +1). Matrices become ``rows.Linear``.
"""

from __future__ import annotations

import torch

from tsspec.errors import ModelLoadError

from .hparams import ASSISTANT_ARCH, Gemma4HParams
from .rows import Linear


def _vec(gf, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    gf.check_tensor(name, shape)
    return gf.tensor(name).to(dtype).reshape(shape).contiguous()


def _mat(gf, name: str, shape: tuple[int, int], dtype: torch.dtype, blocks: bool) -> Linear:
    gf.check_tensor(name, shape)
    return Linear(gf, [name], dtype, blocks)


def layer_weights(hp: Gemma4HParams, gf, i: int, dtype: torch.dtype, blocks: bool, vdtype: torch.dtype) -> dict:
    """Layer i's tensors (vectors in ``vdtype``, matrices as Linear)."""
    H, hd, nh, nkv, ff = hp.hidden_size, hp.head_dim(i), hp.n_heads, hp.n_kv[i], hp.ffn[i]
    p = f"blk.{i}."
    w: dict = {
        "attn_norm": _vec(gf, p + "attn_norm.weight", vdtype, (H,)),
        "wq": _mat(gf, p + "attn_q.weight", (nh * hd, H), dtype, blocks),
        "q_norm": _vec(gf, p + "attn_q_norm.weight", vdtype, (hd,)),
        "wo": _mat(gf, p + "attn_output.weight", (H, nh * hd), dtype, blocks),
        "post_attn_norm": _vec(gf, p + "post_attention_norm.weight", vdtype, (H,)),
        "ffn_norm": _vec(gf, p + "ffn_norm.weight", vdtype, (H,)),
        "w_gate": _mat(gf, p + "ffn_gate.weight", (ff, H), dtype, blocks),
        "w_up": _mat(gf, p + "ffn_up.weight", (ff, H), dtype, blocks),
        "w_down": _mat(gf, p + "ffn_down.weight", (H, ff), dtype, blocks),
        "post_ffn_norm": _vec(gf, p + "post_ffw_norm.weight", vdtype, (H,)),
        "scale": (_vec(gf, p + "layer_output_scale.weight", vdtype, (1,))
                  if gf.has_tensor(p + "layer_output_scale.weight") else torch.ones(1, dtype=vdtype)),
    }
    own_kv = i < hp.first_shared and hp.arch != ASSISTANT_ARCH  # an assistant reads the target's
    if own_kv:
        w["wk"] = _mat(gf, p + "attn_k.weight", (nkv * hd, H), dtype, blocks)
        w["k_norm"] = _vec(gf, p + "attn_k_norm.weight", vdtype, (hd,))
        w["wv"] = _mat(gf, p + "attn_v.weight", (nkv * hd, H), dtype, blocks) if gf.has_tensor(p + "attn_v.weight") else None
        if w["wv"] is None and hp.sliding[i]:
            raise ModelLoadError(gf.path, f"sliding layer {i} has no attn_v (K = V is for full layers only)")
    elif gf.has_tensor(p + "attn_k.weight"):
        raise ModelLoadError(gf.path, f"layer {i} is KV-shared but the file carries its attn_k")
    if hp.ple_dim:
        P = hp.ple_dim
        w["ple_gate"] = _mat(gf, p + "inp_gate.weight", (P, H), dtype, blocks)
        w["ple_proj"] = _mat(gf, p + "proj.weight", (H, P), dtype, blocks)
        w["ple_norm"] = _vec(gf, p + "post_norm.weight", vdtype, (H,))
    if hp.n_experts:
        E, F = hp.n_experts, hp.expert_ffn
        w["router"] = _mat(gf, p + "ffn_gate_inp.weight", (E, H), dtype, blocks)
        w["router_scale"] = _vec(gf, p + "ffn_gate_inp.scale", vdtype, (H,))
        w["expert_scale"] = _vec(gf, p + "ffn_down_exps.scale", vdtype, (E,))
        gf.check_tensor(p + "ffn_gate_up_exps.weight", (E, 2 * F, H))
        gf.check_tensor(p + "ffn_down_exps.weight", (E, H, F))
        gate_up, down = gf.tensor(p + "ffn_gate_up_exps.weight"), gf.tensor(p + "ffn_down_exps.weight")
        w["experts"] = [(Linear(gf, [], dtype, blocks, dense=gate_up[e]), Linear(gf, [], dtype, blocks, dense=down[e]))
                        for e in range(E)]
        for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
            w[name] = _vec(gf, p + name + ".weight", vdtype, (H,))
    return w


def check_layer_count(hp: Gemma4HParams, gf) -> None:
    if gf.has_tensor(f"blk.{hp.n_layers}.attn_norm.weight"):
        raise ModelLoadError(gf.path, f"has a layer {hp.n_layers} beyond block_count {hp.n_layers}")


def rope_factors(hp: Gemma4HParams, gf) -> torch.Tensor | None:
    if not gf.has_tensor("rope_freqs.weight"):
        return None
    gf.check_tensor("rope_freqs.weight", (hp.head_dim_full // 2,))
    return gf.tensor("rope_freqs.weight").to(torch.float64)
