"""Hugging Face Muse-Glimmer checkpoints -> GGUF, with llama.cpp's names and conventions.

``muse_glimmer_gguf(text_config, state_dict)`` is the whole trunk mapping; ``convert_muse_glimmer``
reads an HF directory (``config.json`` + safetensors) and writes the file; ``convert_assistant``
writes the ``muse_glimmer_assistant`` drafter as GGUF ``dflash`` through the block plugin's
DFlash converter. Conventions (Muse-Glimmer):

* ``model.language_model.*`` (or a text-only ``model.*``) -> ``token_embd``, ``output_norm``,
  ``output``; per layer ``attn_norm`` (input_layernorm), ``post_attention_norm``, ``ffn_norm``
  (pre_feedforward_layernorm), ``post_ffw_norm``, ``attn_q/k/v/output``, ``attn_gate``
  (self_attn.gate_proj), ``ffn_gate/up/down``. The vision tower and its projector are skipped.
* The four layer norms are HF ``x_hat * (1 + w)``: the +1 is folded in. The final norm is plain
  ``x_hat * w`` in HF and is written as it is (trap 1).
* QK-norm is scaleless in HF: ``attn_q_norm`` = ``qk_scale_factor`` everywhere, ``attn_k_norm`` = 1.
* Q and K rows are permuted per head from HF's rotate-half order to ggml's adjacent pairs (the
  NORM rope llama.cpp runs on the sliding layers).
* ``attention.sliding_window_pattern`` is written per layer (True = sliding), so any pattern
  round-trips, not only the 3:1 one. HF applies RoPE where ``layer_rope_theta`` is non-zero and
  llama.cpp where the layer slides; a checkpoint where the two disagree is refused. HF rotates
  every RoPE layer with the one global theta: both ``rope.freq_base`` keys carry it.
* ``logit_scale`` = ``output_multiplier``; ``final_logit_softcapping`` as it is; the
  post-norm epsilon in ``attention.post_norm_rms_epsilon``.

Tokenizers are not converted: the file is token-id only (``tsspec generate`` takes ids).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tsspec_gguf.hf_checkpoint import OUT_TYPES, ConversionError, quantised, read_checkpoint  # noqa: F401 (re-exported)

from .hparams import ARCH, POST_NORM_EPS_KEY

log = logging.getLogger("tsspec.muse_glimmer")

# the released checkpoint's logit transform (transformers' MuseGlimmerTextConfig defaults): the
# assistant's own config does not carry it, and its selector needs it
DEFAULT_OUTPUT_MULTIPLIER = 0.19611613513818404
DEFAULT_SOFTCAP = 20.0
# the checkpoint type a DFlash converter registers (an algorithm plugin's; reached through convert_as)
DFLASH_CHECKPOINT = "DFlashDraftModel"
TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.", "")
LAYER_NAMES = {
    "input_layernorm.weight": ("attn_norm.weight", True),
    "post_attention_layernorm.weight": ("post_attention_norm.weight", True),
    "pre_feedforward_layernorm.weight": ("ffn_norm.weight", True),
    "post_feedforward_layernorm.weight": ("post_ffw_norm.weight", True),
    "self_attn.v_proj.weight": ("attn_v.weight", False),
    "self_attn.o_proj.weight": ("attn_output.weight", False),
    "self_attn.gate_proj.weight": ("attn_gate.weight", False),
    "mlp.gate_proj.weight": ("ffn_gate.weight", False),
    "mlp.up_proj.weight": ("ffn_up.weight", False),
    "mlp.down_proj.weight": ("ffn_down.weight", False),
}


def permute_for_gguf(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF rotate-half row order -> ggml adjacent-pair order, per head: HF row ``j * hd/2 + i``
    becomes row ``2 i + j``."""
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def text_config_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text part of a ``muse_glimmer`` config (or a ``muse_glimmer_text`` config itself)."""
    text = config.get("text_config")
    return dict(text) if isinstance(text, Mapping) else dict(config)


def _layer_flags(cfg: Mapping[str, Any], n: int, fail) -> list[bool]:
    types = cfg.get("layer_types") or ["full_attention" if (n - 1 - i) % 4 == 0 else "sliding_attention" for i in range(n)]
    if len(types) != n or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise fail(f"layer_types must name sliding_attention / full_attention for each of {n} layers")
    sliding = [t == "sliding_attention" for t in types]
    thetas = cfg.get("layer_rope_theta")
    if thetas is not None:
        if len(thetas) != n:
            raise fail(f"layer_rope_theta has {len(thetas)} entries for {n} layers")
        roped = [bool(t) for t in thetas]
        if roped != sliding:
            raise fail("layers with RoPE (layer_rope_theta != 0) must be exactly the sliding layers, as in "
                       "llama.cpp's muse-glimmer graph")
    return sliding


def _rope_theta(cfg: Mapping[str, Any]) -> float:
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ConversionError("config", f"rope_type {rope.get('rope_type')!r} is not supported (default only)")
    return float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def muse_glimmer_gguf(
    config: Mapping[str, Any], state_dict: Mapping[str, Any], *, source: str = "<state dict>"
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(metadata, tensors) for ``write_gguf`` from a (text or full) config and state dict."""

    def fail(problem: str) -> ConversionError:
        return ConversionError(source, problem)

    cfg = text_config_of(config)
    prefix = next((p for p in TEXT_PREFIXES if p + "embed_tokens.weight" in state_dict), None)
    if prefix is None:
        raise fail("no embed_tokens.weight under model.language_model. or model.: not a Muse-Glimmer checkpoint")

    def t(name: str) -> np.ndarray:
        if name not in state_dict:
            raise fail(f"missing tensor {name}")
        value = state_dict[name]
        return value.detach().float().cpu().numpy() if hasattr(value, "detach") else np.asarray(value, np.float32)

    n = int(cfg["num_hidden_layers"])
    n_heads, n_kv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // n_heads)
    theta = _rope_theta(cfg)
    eps = float(cfg.get("rms_norm_eps", 1e-5))
    window = cfg.get("sliding_window") or int(cfg.get("max_position_embeddings", 131072))
    softcap = cfg.get("final_logit_softcapping")
    a = ARCH + "."
    metadata: dict[str, Any] = {
        a + "block_count": n,
        a + "context_length": int(cfg.get("max_position_embeddings", 131072)),
        a + "embedding_length": hidden,
        a + "feed_forward_length": int(cfg["intermediate_size"]),
        a + "attention.head_count": n_heads,
        a + "attention.head_count_kv": n_kv,
        a + "attention.key_length": head_dim,
        a + "attention.value_length": head_dim,
        a + "attention.layer_norm_rms_epsilon": eps,
        a + POST_NORM_EPS_KEY: float(cfg.get("post_norm_eps", 1e-8)),
        a + "attention.sliding_window": int(window),
        a + "attention.sliding_window_pattern": _layer_flags(cfg, n, fail),
        a + "rope.dimension_count": head_dim,
        a + "rope.freq_base": theta,
        a + "rope.freq_base_swa": theta,
        a + "logit_scale": float(cfg.get("output_multiplier", 1.0)),
        a + "final_logit_softcapping": float(softcap or 0.0),
        a + "vocab_size": int(cfg["vocab_size"]),
    }
    lm_head = next((k for k in ("lm_head.weight", "model.lm_head.weight") if k in state_dict), None)
    if lm_head is None:
        if not cfg.get("tie_word_embeddings"):
            raise fail("missing tensor lm_head.weight")
        lm_head = prefix + "embed_tokens.weight"
    ones = np.ones(head_dim, dtype=np.float32)
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": t(prefix + "embed_tokens.weight"),
        "output_norm.weight": t(prefix + "norm.weight"),
        "output.weight": t(lm_head),
    }
    for i in range(n):
        hf, gg = f"{prefix}layers.{i}.", f"blk.{i}."
        for src, (dst, plus_one) in LAYER_NAMES.items():
            value = t(hf + src)
            tensors[gg + dst] = value + 1.0 if plus_one else value
        tensors[gg + "attn_q.weight"] = permute_for_gguf(t(hf + "self_attn.q_proj.weight"), n_heads)
        tensors[gg + "attn_k.weight"] = permute_for_gguf(t(hf + "self_attn.k_proj.weight"), n_kv)
        tensors[gg + "attn_q_norm.weight"] = ones * np.float32(cfg.get("qk_scale_factor", 1.0))
        tensors[gg + "attn_k_norm.weight"] = ones.copy()
    return metadata, tensors


def write_muse_glimmer_gguf(path, config: Mapping[str, Any], state_dict: Mapping[str, Any], *,
                            outtype: str = "f32", quantize: Mapping[str, Any] | None = None,
                            extra_tensors: Mapping[str, Any] | None = None,
                            extra_metadata: Mapping[str, Any] | None = None) -> str:
    """Write the trunk GGUF. ``quantize`` maps a tensor-name fragment (``"*"``: every matrix) to
    a ggml type (the tests' quantised files); ``extra_*`` are added as they are (a carried
    assistant)."""
    from tsspec_gguf.gguf_writer_util import write_gguf

    metadata, tensors = muse_glimmer_gguf(config, state_dict)
    tensors = quantised(tensors, outtype)
    for name, array in list(tensors.items()):
        kind = next((k for frag, k in (quantize or {}).items() if frag == "*" or frag in name), None)
        if kind is not None and getattr(array, "ndim", 0) == 2:
            tensors[name] = (array, kind)
    tensors.update(extra_tensors or {})
    metadata.update(extra_metadata or {})
    return write_gguf(path, ARCH, metadata, tensors)


def convert_muse_glimmer(src_dir: str | Path, out_path: str | Path, *, outtype: str = "f32") -> None:
    """HF ``muse_glimmer`` (text part) -> GGUF ``muse-glimmer``."""
    config, state = read_checkpoint(src_dir)
    vision = [k for k in state if "vision" in k]
    if vision:
        log.warning("%s: the vision tower (%d tensors) is skipped; the GGUF holds the text trunk only", src_dir, len(vision))
    write_muse_glimmer_gguf(out_path, config, {k: v for k, v in state.items() if "vision" not in k}, outtype=outtype)


def convert_assistant(src_dir: str | Path, out_path: str | Path, *, outtype: str = "f32") -> None:
    """HF ``muse_glimmer_assistant`` -> GGUF ``dflash`` through the converter a plugin registered
    for DFlash checkpoints (``convert_as``: this plugin imports none), with the target's logit
    transform as ``dflash.logit_scale`` / ``dflash.final_logit_softcapping`` (the config's
    ``output_multiplier`` / ``final_logit_softcapping`` when it names them, else the released
    Muse-Glimmer's values)."""
    from tsspec.runtime.converting import convert_as

    if outtype == "q8_0":
        raise ConversionError("--outtype", "the DFlash assistant is written as f32 or f16, not q8_0")
    config, _ = read_checkpoint(src_dir)
    scale = float(config.get("output_multiplier", DEFAULT_OUTPUT_MULTIPLIER))
    softcap = float(config.get("final_logit_softcapping", DEFAULT_SOFTCAP))
    convert_as(DFLASH_CHECKPOINT, src_dir, out_path, outtype=outtype, logit_scale=scale, softcap=softcap)
