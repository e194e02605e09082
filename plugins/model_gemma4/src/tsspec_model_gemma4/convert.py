"""Hugging Face Gemma 4 checkpoints -> GGUF, with llama.cpp's names and keys.

``gemma4_gguf(config, state_dict)`` maps a ``Gemma4ForCausalLM`` (``gemma4_text``) or the text
part of a ``Gemma4ForConditionalGeneration`` (``model.language_model.*``; the vision and audio
towers are skipped); ``assistant_gguf`` maps a ``Gemma4AssistantForCausalLM`` to
``gemma4-assistant``. Tensor names follow gguf-py's ``gemma4`` map (transformers' GGUF mapping
reads the same), plus llama.cpp's assistant tensors (``nextn.pre_projection``,
``nextn.post_projection``, ``masked_embd_centroids``, ``masked_embd_ordering``; llama.cpp's own
converter drops the last two, this one keeps them for the centroid-masked head). Norms are
written as they are (Gemma 4's RMSNorm is ``x_hat * w``, no +1); Q/K rows keep HF's
rotate-half order (llama.cpp runs Gemma's NEOX RoPE). The full layers' "proportional" RoPE
becomes the ``rope_freqs`` tensor (1 for rotated pairs, 1e30 for the others).
Tokenizers are not converted: the file is token-id only.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np

from tsspec_gguf.hf_checkpoint import OUT_TYPES, ConversionError, quantised, read_checkpoint  # noqa: F401 (re-exported)

from .hparams import ARCH, ASSISTANT_ARCH

log = logging.getLogger("tsspec.gemma4")
TEXT_PREFIXES = ("model.language_model.", "model.", "")
LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "per_layer_input_gate": "inp_gate", "per_layer_projection": "proj", "post_per_layer_input_norm": "post_norm",
    "router.proj": "ffn_gate_inp", "pre_feedforward_layernorm_2": "pre_ffw_norm_2",
    "post_feedforward_layernorm_1": "post_ffw_norm_1", "post_feedforward_layernorm_2": "post_ffw_norm_2",
}


def _array(value) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        return value.numpy() if value.dtype.is_floating_point is False else value.double().numpy().astype(np.float32)
    return np.asarray(value)


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return dict(text) if isinstance(text, Mapping) else dict(config)


def _rope(cfg: Mapping[str, Any], kind: str, fail) -> dict[str, Any]:
    params = (cfg.get("rope_parameters") or {}).get(kind)
    if params is None:
        params = ({"rope_type": "default", "rope_theta": 10_000.0} if kind == "sliding_attention" else
                  {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0})
    if params.get("rope_type", "default") not in ("default", "proportional") or params.get("factor", 1.0) != 1.0:
        raise fail(f"{kind} rope {params!r} is not supported (default or proportional, factor 1)")
    return params


def _layer_types(cfg: Mapping[str, Any], n: int, fail) -> list[str]:
    types = list(cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)])
    if len(types) != n or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise fail(f"layer_types must name sliding_attention / full_attention for each of {n} layers")
    return types


def _common(cfg: Mapping[str, Any], arch: str, fail) -> tuple[dict[str, Any], np.ndarray]:
    """The keys a trunk and an assistant share, and the full layers' rope_freqs."""
    n = int(cfg["num_hidden_layers"])
    types = _layer_types(cfg, n, fail)
    hd_swa = int(cfg.get("head_dim") or 256)
    n_kv = int(cfg.get("num_key_value_heads", 1))
    overrides = {int(k): v for k, v in (cfg.get("per_layer_config") or {}).items()}  # a saved config's per-layer values
    fulls = [i for i, t in enumerate(types) if t == "full_attention"]
    first = overrides.get(fulls[0], {}) if fulls else {}
    hd_full = int(first.get("head_dim") or cfg.get("global_head_dim") or hd_swa)
    n_kv_full = int(first.get("num_key_value_heads") or
                    (cfg.get("num_global_key_value_heads") if cfg.get("attention_k_eq_v") else None) or n_kv)
    if any(int(overrides.get(i, {}).get("head_dim") or hd_full) != hd_full for i in fulls):
        raise fail("full layers with different head dims are not supported")
    shared = int(cfg.get("num_kv_shared_layers") or 0)
    ff = int(cfg["intermediate_size"])
    ffn = [ff * 2 if cfg.get("use_double_wide_mlp") and i >= n - shared else ff for i in range(n)]
    swa, full = _rope(cfg, "sliding_attention", fail), _rope(cfg, "full_attention", fail)
    swa_rot = int(hd_swa * float(swa.get("partial_rotary_factor", 1.0))) if swa.get("rope_type") == "proportional" else hd_swa
    full_rot = int(hd_full * float(full.get("partial_rotary_factor", 1.0)) / 2) if full.get("rope_type") == "proportional" else hd_full // 2
    a = arch + "."
    meta: dict[str, Any] = {
        a + "block_count": n,
        a + "context_length": int(cfg.get("max_position_embeddings", 131072)),
        a + "embedding_length": int(cfg["hidden_size"]),
        a + "feed_forward_length": ffn if len(set(ffn)) > 1 else ff,
        a + "attention.head_count": int(cfg["num_attention_heads"]),
        a + "attention.head_count_kv": [n_kv if t == "sliding_attention" else n_kv_full for t in types],
        a + "attention.key_length": hd_full, a + "attention.value_length": hd_full,
        a + "attention.key_length_swa": hd_swa, a + "attention.value_length_swa": hd_swa,
        a + "attention.layer_norm_rms_epsilon": float(cfg.get("rms_norm_eps", 1e-6)),
        a + "attention.sliding_window": int(cfg.get("sliding_window", 512)),
        a + "attention.sliding_window_pattern": [t == "sliding_attention" for t in types],
        a + "attention.shared_kv_layers": shared,
        a + "embedding_length_per_layer_input": int(cfg.get("hidden_size_per_layer_input") or 0),
        a + "rope.dimension_count": hd_full, a + "rope.dimension_count_swa": swa_rot,
        a + "rope.freq_base": float(full.get("rope_theta", 1_000_000.0)),
        a + "rope.freq_base_swa": float(swa.get("rope_theta", 10_000.0)),
        a + "final_logit_softcapping": float(cfg.get("final_logit_softcapping") or 0.0),
        a + "vocab_size": int(cfg["vocab_size"]),
    }
    if cfg.get("enable_moe_block"):
        meta[a + "expert_count"] = int(cfg["num_experts"])
        meta[a + "expert_used_count"] = int(cfg["top_k_experts"])
        meta[a + "expert_feed_forward_length"] = int(cfg["moe_intermediate_size"])
    factors = np.array([1.0] * full_rot + [1e30] * (hd_full // 2 - full_rot), dtype=np.float32)
    return meta, factors


def _layers(state: Mapping[str, Any], prefix: str, n: int, t, tensors: dict[str, np.ndarray]) -> None:
    for i in range(n):
        hf, gg = f"{prefix}layers.{i}.", f"blk.{i}."
        for src, dst in LAYER_NAMES.items():
            if hf + src + ".weight" in state:
                tensors[gg + dst + ".weight"] = t(hf + src + ".weight")
        if hf + "layer_scalar" in state:
            tensors[gg + "layer_output_scale.weight"] = t(hf + "layer_scalar").reshape(1)
        if hf + "router.scale" in state:
            tensors[gg + "ffn_gate_inp.scale"] = t(hf + "router.scale")
            tensors[gg + "ffn_down_exps.scale"] = t(hf + "router.per_expert_scale")
            tensors[gg + "ffn_gate_up_exps.weight"] = t(hf + "experts.gate_up_proj")
            tensors[gg + "ffn_down_exps.weight"] = t(hf + "experts.down_proj")


def _getter(state: Mapping[str, Any], fail):
    def t(name: str) -> np.ndarray:
        if name not in state:
            raise fail(f"missing tensor {name}")
        return _array(state[name])
    return t


def gemma4_gguf(config: Mapping[str, Any], state: Mapping[str, Any], *, source: str = "<state dict>"):
    """(metadata, tensors) of the ``gemma4`` text trunk."""
    def fail(problem: str) -> ConversionError:
        return ConversionError(source, problem)

    cfg = _text_config(config)
    prefix = next((p for p in TEXT_PREFIXES if p + "embed_tokens.weight" in state), None)
    if prefix is None:
        raise fail("no embed_tokens.weight under model.language_model. or model.: not a Gemma 4 checkpoint")
    if cfg.get("use_bidirectional_attention") == "all":
        raise fail("use_bidirectional_attention='all' is not a causal language model")
    t = _getter(state, fail)
    meta, factors = _common(cfg, ARCH, fail)
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": t(prefix + "embed_tokens.weight"),
        "output_norm.weight": t(prefix + "norm.weight"),
        "rope_freqs.weight": factors,
    }
    if "lm_head.weight" in state and not cfg.get("tie_word_embeddings", True):
        tensors["output.weight"] = t("lm_head.weight")
    if cfg.get("hidden_size_per_layer_input"):
        tensors["per_layer_token_embd.weight"] = t(prefix + "embed_tokens_per_layer.weight")
        tensors["per_layer_model_proj.weight"] = t(prefix + "per_layer_model_projection.weight")
        tensors["per_layer_proj_norm.weight"] = t(prefix + "per_layer_projection_norm.weight")
    _layers(state, prefix, int(cfg["num_hidden_layers"]), t, tensors)
    return meta, tensors


def assistant_gguf(config: Mapping[str, Any], state: Mapping[str, Any], *, source: str = "<state dict>"):
    """(metadata, tensors) of a ``gemma4_assistant`` checkpoint as ``gemma4-assistant``."""
    def fail(problem: str) -> ConversionError:
        return ConversionError(source, problem)

    cfg = _text_config(config)
    n = int(cfg["num_hidden_layers"])
    cfg = {**cfg, "num_kv_shared_layers": n}  # every assistant layer reads the target's K/V
    t = _getter(state, fail)
    meta, factors = _common(cfg, ASSISTANT_ARCH, fail)
    a = ASSISTANT_ARCH + "."
    meta[a + "embedding_length_out"] = int(config.get("backbone_hidden_size", 0)) or int(cfg["hidden_size"])
    meta[a + "nextn_predict_layers"] = n
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": t("model.embed_tokens.weight"),
        "output_norm.weight": t("model.norm.weight"),
        "rope_freqs.weight": factors,
        "nextn.pre_projection.weight": t("pre_projection.weight"),
        "nextn.post_projection.weight": t("post_projection.weight"),
    }
    if config.get("use_ordered_embeddings"):
        meta[a + "num_centroids"] = int(config.get("num_centroids", 2048))
        meta[a + "centroid_intermediate_top_k"] = int(config.get("centroid_intermediate_top_k", 32))
        tensors["masked_embd_centroids.weight"] = t("masked_embedding.centroids.weight")
        tensors["masked_embd_ordering"] = t("masked_embedding.token_ordering").astype(np.float32)  # exact below 2**24
    _layers(state, "model.", n, t, tensors)
    return meta, tensors


def write(path, arch: str, meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray], outtype: str = "f32") -> str:
    from tsspec_gguf.gguf_writer import write_gguf

    return write_gguf(path, arch, dict(meta), quantised(tensors, outtype))


def convert_gemma4(src_dir, out_path, *, outtype: str = "f32") -> str:
    config, state = read_checkpoint(src_dir)
    if any(k.startswith(("model.vision_tower.", "model.audio_tower.")) for k in state):
        log.warning("%s: the vision/audio towers are skipped (text trunk only)", src_dir)
    meta, tensors = gemma4_gguf(config, state, source=str(src_dir))
    return write(out_path, ARCH, meta, tensors, outtype)


def convert_assistant(src_dir, out_path, *, outtype: str = "f32") -> str:
    config, state = read_checkpoint(src_dir)
    meta, tensors = assistant_gguf(config, state, source=str(src_dir))
    return write(out_path, ASSISTANT_ARCH, meta, tensors, outtype)
