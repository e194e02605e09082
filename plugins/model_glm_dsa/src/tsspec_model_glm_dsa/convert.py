"""Hugging Face GLM 5.x checkpoints (``glm_moe_dsa``) -> GGUF ``glm-dsa`` (llama.cpp's names and
metadata, as its ``GlmMoeDsaModel`` converter writes them), NextN layer included.

``convert_state_dict(config, state_dict) -> (arch, metadata, tensors)`` is the whole mapping;
``convert_hf_dir`` reads ``config.json`` and the safetensors shards and writes the file (the
converter registered for ``glm_moe_dsa``). Experts come per expert (``mlp.experts.E.gate_proj``,
the released checkpoints) or fused (transformers' in-memory ``mlp.experts.gate_up_proj``); MLA's
``kv_b_proj`` is split per head into ``attn_k_b`` (transposed, for absorption) and ``attn_v_b``.
The NextN layer ``model.layers.L`` (L = ``num_hidden_layers``) becomes ``blk.L``, its extra
tensors ``blk.L.nextn.*``, and its tensors are written LAST, so a loader that skips them skips
one contiguous tail of the file. Tokenizers are not converted (the file is token-id only);
FP8 checkpoints (``weight_scale_inv`` companions) are refused: dequantise them first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .hparams import ARCHITECTURE

__all__ = ["convert_state_dict", "convert_hf_dir", "ConversionError"]


class ConversionError(ValueError):
    """A checkpoint this converter cannot map (one line, names the problem)."""


_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.indexer.wq_b.weight": "indexer.attn_q_b.weight",
    "self_attn.indexer.wk.weight": "indexer.attn_k.weight",
    "self_attn.indexer.k_norm.weight": "indexer.k_norm.weight",
    "self_attn.indexer.k_norm.bias": "indexer.k_norm.bias",
    "self_attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    # the NextN layer's own tensors
    "eh_proj.weight": "nextn.eh_proj.weight",
    "enorm.weight": "nextn.enorm.weight",
    "hnorm.weight": "nextn.hnorm.weight",
    "shared_head.norm.weight": "nextn.shared_head_norm.weight",
    "shared_head.head.weight": "nextn.shared_head_head.weight",
    "embed_tokens.weight": "nextn.embed_tokens.weight",
}
REQUIRED = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
            "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
            "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "index_n_heads",
            "index_head_dim", "index_topk")
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).contiguous().numpy()


def _metadata(cfg: Mapping[str, Any], nextn: int) -> dict[str, Any]:
    rope = dict(cfg.get("rope_parameters") or {})
    kind = rope.get("rope_type", "default")
    if kind not in ("default", None) or float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConversionError(f"rope_parameters {rope!r}: only plain RoPE (rope_type default) is supported")
    L = int(cfg["num_hidden_layers"])
    n_dense = cfg.get("first_k_dense_replace")
    if cfg.get("mlp_layer_types"):
        kinds = list(cfg["mlp_layer_types"])[:L]
        n_dense = next((i for i, k in enumerate(kinds) if k != "dense"), L)
        if any(k == "dense" for k in kinds[n_dense:]):
            raise ConversionError(f"mlp_layer_types {kinds}: dense layers must all lead")
    kv_lora, rope_dim = int(cfg["kv_lora_rank"]), int(cfg["qk_rope_head_dim"])
    types = cfg.get("indexer_types") or ["full"] * L
    a = ARCHITECTURE
    meta: dict[str, Any] = {
        f"{a}.block_count": L + nextn,
        f"{a}.context_length": int(cfg.get("max_position_embeddings", 4096)),
        f"{a}.embedding_length": int(cfg["hidden_size"]),
        f"{a}.feed_forward_length": int(cfg["intermediate_size"]),
        f"{a}.attention.head_count": int(cfg["num_attention_heads"]),
        f"{a}.attention.head_count_kv": 1,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.get("rms_norm_eps", 1e-5)),
        f"{a}.rope.freq_base": float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        f"{a}.rope.dimension_count": rope_dim,
        f"{a}.leading_dense_block_count": int(n_dense or 0),
        f"{a}.vocab_size": int(cfg["vocab_size"]),
        f"{a}.attention.q_lora_rank": int(cfg["q_lora_rank"]),
        f"{a}.attention.kv_lora_rank": kv_lora,
        f"{a}.attention.key_length": kv_lora + rope_dim,
        f"{a}.attention.value_length": kv_lora,
        f"{a}.attention.key_length_mla": int(cfg["qk_nope_head_dim"]) + rope_dim,
        f"{a}.attention.value_length_mla": int(cfg["v_head_dim"]),
        f"{a}.expert_feed_forward_length": int(cfg["moe_intermediate_size"]),
        f"{a}.expert_count": int(cfg["n_routed_experts"]),
        f"{a}.expert_used_count": int(cfg["num_experts_per_tok"]),
        f"{a}.expert_shared_count": int(cfg.get("n_shared_experts", 1)),
        f"{a}.expert_weights_scale": float(cfg.get("routed_scaling_factor", 1.0)),
        f"{a}.expert_gating_func": 2,  # sigmoid
        f"{a}.expert_group_count": int(cfg.get("n_group", 1)),
        f"{a}.expert_group_used_count": int(cfg.get("topk_group", 1)),
        f"{a}.attention.indexer.head_count": int(cfg["index_n_heads"]),
        f"{a}.attention.indexer.key_length": int(cfg["index_head_dim"]),
        f"{a}.attention.indexer.top_k": int(cfg["index_topk"]),
        f"{a}.attention.indexer.types": [t == "full" for t in list(types)[:L]],
    }
    if cfg.get("norm_topk_prob", True):
        meta[f"{a}.expert_weights_norm"] = True
    if nextn:
        meta[f"{a}.nextn_predict_layers"] = nextn
    return meta


def convert_state_dict(config: Any, state_dict: Mapping[str, torch.Tensor]
                       ) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    """(GGUF architecture, metadata with full key names, tensors in numpy order, NextN last)."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    if cfg.get("model_type", "glm_moe_dsa") != "glm_moe_dsa":
        raise ConversionError(f"model_type {cfg.get('model_type')!r} is not glm_moe_dsa")
    missing = [k for k in REQUIRED if cfg.get(k) is None]
    if missing:
        raise ConversionError(f"config.json lacks {', '.join(missing)}")
    if any(k.endswith("weight_scale_inv") for k in state_dict):
        raise ConversionError("an FP8 checkpoint (weight_scale_inv tensors): dequantise it first")
    L = int(cfg["num_hidden_layers"])
    heads, nope, v = int(cfg["num_attention_heads"]), int(cfg["qk_nope_head_dim"]), int(cfg["v_head_dim"])
    inter = int(cfg["moe_intermediate_size"])
    trunk: dict[str, np.ndarray] = {}
    tail: dict[str, np.ndarray] = {}
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    unmapped = []
    for key, value in state_dict.items():
        if "rotary_emb" in key:
            continue
        if key in _TOP:
            if key == "lm_head.weight" and cfg.get("tie_word_embeddings", False):
                continue
            trunk[_TOP[key]] = _np(value)
            continue
        m = re.match(r"model\.layers\.(\d+)\.(.+)$", key)
        if not m:
            unmapped.append(key)
            continue
        bid, rest = int(m.group(1)), m.group(2)
        out = tail if bid >= L else trunk
        p = f"blk.{bid}."
        if rest == "self_attn.kv_b_proj.weight":
            kv_b = value.reshape(heads, nope + v, -1)
            out[p + "attn_k_b.weight"] = _np(kv_b[:, :nope].transpose(1, 2))  # [heads, kv_lora, nope]
            out[p + "attn_v_b.weight"] = _np(kv_b[:, nope:])  # [heads, v, kv_lora]
        elif rest == "mlp.experts.gate_up_proj":  # fused [E, 2F, H]
            out[p + "ffn_gate_exps.weight"] = _np(value[:, :inter])
            out[p + "ffn_up_exps.weight"] = _np(value[:, inter:])
        elif rest == "mlp.experts.down_proj":  # fused [E, H, F]
            out[p + "ffn_down_exps.weight"] = _np(value)
        elif (e := re.match(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", rest)):
            experts.setdefault((bid, e.group(2)), {})[int(e.group(1))] = value
        elif rest in _LAYER:
            out[p + _LAYER[rest]] = _np(value)
        else:
            unmapped.append(key)
    if unmapped:
        raise ConversionError(f"{len(unmapped)} tensors have no glm-dsa name, e.g. {unmapped[0]!r}")
    n_experts = int(cfg["n_routed_experts"])
    for (bid, kind), table in sorted(experts.items()):
        if sorted(table) != list(range(n_experts)):
            raise ConversionError(f"layer {bid}: {kind}_proj of {len(table)} of {n_experts} experts")
        (tail if bid >= L else trunk)[f"blk.{bid}.ffn_{kind}_exps.weight"] = _np(torch.stack([table[i] for i in range(n_experts)]))
    nextn = int(cfg.get("num_nextn_predict_layers", 0) or 0) if any(".nextn." in k for k in tail) else 0
    return ARCHITECTURE, _metadata(cfg, nextn), {**trunk, **tail}


def _read_state_dict(src: Path) -> dict[str, torch.Tensor]:
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{src}: no *.safetensors files")
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def write(path: str | Path, arch: str, meta: Mapping[str, Any], tensors: Mapping[str, Any], *,
          outtype: str = "f32") -> None:
    """Write the converted model (``outtype`` f32, f16 or q8_0 for the matrices; norms, biases and
    vectors stay float32)."""
    from gguf import GGMLQuantizationType

    from tsspec_gguf.gguf_writer import write_gguf

    kinds = {"f32": None, "f16": GGMLQuantizationType.F16, "q8_0": GGMLQuantizationType.Q8_0}
    if outtype not in kinds:
        raise ConversionError(f"--outtype {outtype!r}: use f32, f16 or q8_0")
    kind = kinds[outtype]
    out: dict[str, Any] = {}
    for name, value in tensors.items():
        if kind is None or value.ndim < 2:
            out[name] = value
        elif kind == GGMLQuantizationType.Q8_0 and value.shape[-1] % 32:
            out[name] = (value, GGMLQuantizationType.F16)
        else:
            out[name] = (value, kind)
    write_gguf(path, arch, meta, out)


def convert_hf_dir(src_dir: str | Path, out_path: str | Path, *, outtype: str = "f32") -> None:
    """The registered converter: ``converter(src_dir, out_path, *, outtype)``."""
    src = Path(src_dir)
    config_file = src / "config.json"
    if not config_file.is_file():
        raise ConversionError(f"{src}: no config.json")
    config = json.loads(config_file.read_text())
    arch, meta, tensors = convert_state_dict(config, _read_state_dict(src))
    write(out_path, arch, meta, tensors, outtype=outtype)
