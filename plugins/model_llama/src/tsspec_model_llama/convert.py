"""Hugging Face llama checkpoint -> GGUF with llama.cpp's conventions (the oracle tests' writer).

The plugin is checked against ``transformers`` on tiny random configs: build a
``LlamaForCausalLM``, write it here as llama.cpp's converter would, load it with the plugin,
compare logits. Conventions reproduced:

* names: ``model.embed_tokens`` -> ``token_embd``, ``layers.N.self_attn.{q,k,v,o}_proj`` ->
  ``blk.N.attn_{q,k,v,output}``, ``mlp.{gate,up,down}_proj`` -> ``ffn_{gate,up,down}``,
  ``input_layernorm`` -> ``attn_norm``, ``post_attention_layernorm`` -> ``ffn_norm``,
  ``model.norm`` -> ``output_norm``, ``lm_head`` -> ``output`` (omitted when tied).
* Q and K rows are permuted per head from HF's rotate-half order to llama.cpp's adjacent-pair
  order: HF row ``j * hd/2 + i`` is written at row ``2 i + j``.
* ``rope_freqs`` (per-frequency divisors) carries llama-3 style frequency scaling.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from tsspec_gguf.gguf_writer import write_gguf

from .convert_types import MODEL_TYPES

__all__ = ["permute_for_gguf", "llama_gguf_contents", "write_llama_gguf", "convert_hf_dir", "family_gguf_contents",
           "write_family_gguf"]

# --outtype -> the ggml type matrices are written in (None: float32)
MATRIX_TYPES = {"f32": None, "f16": "F16", "q8_0": "Q8_0"}


def permute_for_gguf(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF rotate-half row order -> llama.cpp adjacent-pair order, per head (rows of w)."""
    head_dim = w.shape[0] // n_heads
    tail = w.shape[1:]
    return w.reshape(n_heads, 2, head_dim // 2, *tail).swapaxes(1, 2).reshape(w.shape)


def llama_gguf_contents(
    config: Any, state_dict: Mapping[str, Any], *, rope_freqs: np.ndarray | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(metadata, tensors) for ``write_gguf`` from a HF LlamaConfig and state dict."""

    def t(name: str) -> np.ndarray:
        return state_dict[name].detach().float().cpu().numpy()

    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    rope = getattr(config, "rope_parameters", None) or {}
    metadata: dict[str, Any] = {
        "llama.block_count": config.num_hidden_layers,
        "llama.context_length": config.max_position_embeddings,
        "llama.embedding_length": config.hidden_size,
        "llama.feed_forward_length": config.intermediate_size,
        "llama.attention.head_count": n_heads,
        "llama.attention.head_count_kv": n_kv,
        "llama.attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "llama.rope.freq_base": float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
        "llama.rope.dimension_count": head_dim,
        "llama.vocab_size": config.vocab_size,
    }
    if head_dim * n_heads != config.hidden_size:
        metadata["llama.attention.key_length"] = head_dim
        metadata["llama.attention.value_length"] = head_dim
    if rope.get("rope_type") == "linear":
        metadata["llama.rope.scaling.type"] = "linear"
        metadata["llama.rope.scaling.factor"] = float(rope["factor"])
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": t("model.embed_tokens.weight"),
        "output_norm.weight": t("model.norm.weight"),
    }
    if not config.tie_word_embeddings:
        tensors["output.weight"] = t("lm_head.weight")
    if rope_freqs is not None:
        tensors["rope_freqs.weight"] = np.asarray(rope_freqs, dtype=np.float32)
    for i in range(config.num_hidden_layers):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        tensors[gg + "attn_norm.weight"] = t(hf + "input_layernorm.weight")
        tensors[gg + "attn_q.weight"] = permute_for_gguf(t(hf + "self_attn.q_proj.weight"), n_heads)
        tensors[gg + "attn_k.weight"] = permute_for_gguf(t(hf + "self_attn.k_proj.weight"), n_kv)
        tensors[gg + "attn_v.weight"] = t(hf + "self_attn.v_proj.weight")
        tensors[gg + "attn_output.weight"] = t(hf + "self_attn.o_proj.weight")
        if hf + "self_attn.q_proj.bias" in state_dict:
            tensors[gg + "attn_q.bias"] = permute_for_gguf(t(hf + "self_attn.q_proj.bias"), n_heads)
            tensors[gg + "attn_k.bias"] = permute_for_gguf(t(hf + "self_attn.k_proj.bias"), n_kv)
            tensors[gg + "attn_v.bias"] = t(hf + "self_attn.v_proj.bias")
            tensors[gg + "attn_output.bias"] = t(hf + "self_attn.o_proj.bias")
        tensors[gg + "ffn_norm.weight"] = t(hf + "post_attention_layernorm.weight")
        tensors[gg + "ffn_gate.weight"] = t(hf + "mlp.gate_proj.weight")
        tensors[gg + "ffn_up.weight"] = t(hf + "mlp.up_proj.weight")
        tensors[gg + "ffn_down.weight"] = t(hf + "mlp.down_proj.weight")
    return metadata, tensors


def write_llama_gguf(
    path: str | os.PathLike[str],
    model: Any,
    *,
    tokenizer: Mapping[str, Any] | None = None,
    rope_freqs: np.ndarray | None = None,
    quantize: Mapping[str, Any] | None = None,
) -> str:
    """Write a HF ``LlamaForCausalLM`` as a llama GGUF (float32 tensors). ``quantize`` maps a
    tensor-name fragment (``"attn_v"``, ``"ffn"``, ``"token_embd"``, ``"*"`` for every matrix)
    to a ggml type the matrices whose names contain it are quantised to (gguf's quantiser; the
    first matching fragment wins); vectors stay float32."""
    metadata, tensors = llama_gguf_contents(model.config, model.state_dict(), rope_freqs=rope_freqs)
    if quantize:
        for name, array in list(tensors.items()):
            if array.ndim != 2:
                continue
            kind = next((k for frag, k in quantize.items() if frag == "*" or frag in name), None)
            if kind is not None:
                tensors[name] = (array, kind)
    return write_gguf(path, "llama", metadata, tensors, tokenizer=tokenizer)


CONFIG_DEFAULTS = {"tie_word_embeddings": False, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}
TIED_BY_DEFAULT = ("gemma2", "gemma3")  # transformers' default for these configs


def convert_hf_dir(src_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], *, outtype: str = "f32") -> str:
    """A Hugging Face checkpoint directory (config.json, safetensors, tokenizer files) of a
    family in ``MODEL_TYPES`` -> a GGUF with its tokenizer, special tokens and chat template.
    Matrices in ``outtype`` (f32, f16, q8_0; Q8_0 only where rows split into 32-value
    blocks), vectors in float32. Whatever is missing is a ModelLoadError naming it."""
    import json
    import types
    from pathlib import Path

    from gguf import GGMLQuantizationType
    from safetensors.torch import load_file

    from tsspec.errors import ModelLoadError

    from .tokenizer_export import tokenizer_metadata

    src = Path(src_dir)
    if outtype not in MATRIX_TYPES:
        raise ModelLoadError(src, f"--outtype {outtype!r}: use {', '.join(MATRIX_TYPES)}")
    if not (src / "config.json").is_file():
        raise ModelLoadError(src, "no config.json")
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(src, "no *.safetensors files")
    raw = json.loads((src / "config.json").read_text())
    arch = MODEL_TYPES.get(raw.get("model_type"))
    if arch is None:
        raise ModelLoadError(src, f"model_type {raw.get('model_type')!r} is not one this converter takes "
                                  f"({', '.join(MODEL_TYPES)})")
    defaults = dict(CONFIG_DEFAULTS, tie_word_embeddings=arch in TIED_BY_DEFAULT)
    config = types.SimpleNamespace(**{**defaults, **raw})
    tokenizer = tokenizer_metadata(src)
    state: dict[str, Any] = {}
    for shard in shards:
        state.update(load_file(str(shard)))
    try:
        if arch == "llama":
            metadata, tensors = llama_gguf_contents(config, state)
        else:
            metadata, tensors = family_gguf_contents(arch, config, state)
    except KeyError as exc:
        raise ModelLoadError(src, f"the checkpoint has no tensor {exc.args[0]!r}") from None
    except ValueError as exc:
        raise ModelLoadError(src, str(exc)) from None
    kind = MATRIX_TYPES[outtype]
    if kind is not None:
        ggml = getattr(GGMLQuantizationType, kind)
        for name, array in list(tensors.items()):
            if array.ndim == 2 and (kind != "Q8_0" or array.shape[-1] % 32 == 0):
                tensors[name] = (array, ggml)
    return write_gguf(out_path, arch, metadata, tensors, tokenizer=tokenizer)


# HF module name -> GGUF tensor name, per layer, for the families beyond llama
_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
}
# where the two norms around the feed-forward go: gemma has four norms a layer, the others two
_POST_NORMS = {
    True: {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
           "post_feedforward_layernorm": "post_ffw_norm"},
    False: {"post_attention_layernorm": "ffn_norm"},
}


def family_gguf_contents(arch: str, config: Any, state_dict: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(metadata, tensors) of a HF qwen2 / qwen3 / phi3 / gemma2 / gemma3 text model as
    llama.cpp's converter writes them: NEOX families keep HF's Q/K row order, Gemma's norm
    weights get the + 1 its RMSNorm applies (llama.cpp files store w + 1), fused tensors stay
    fused."""
    from .families import FAMILIES

    family = FAMILIES[arch]

    def t(name: str) -> np.ndarray:
        return state_dict[name].detach().float().cpu().numpy()

    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    rope = dict(getattr(config, "rope_parameters", None) or {})
    local_rope = rope.get("sliding_attention", {})
    rope = rope.get("full_attention", rope)
    if "rope_theta" not in rope and getattr(config, "rope_theta", None):  # a config.json of older transformers
        rope["rope_theta"] = config.rope_theta
    if not local_rope and getattr(config, "rope_local_base_freq", None):
        local_rope = {"rope_theta": config.rope_local_base_freq}
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    rope_dim = int(head_dim * float(partial or 1.0))
    m = {
        "block_count": config.num_hidden_layers,
        "context_length": config.max_position_embeddings,
        "embedding_length": config.hidden_size,
        "feed_forward_length": config.intermediate_size,
        "attention.head_count": n_heads,
        "attention.head_count_kv": n_kv,
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "rope.freq_base": float(rope.get("rope_theta", 10000.0)),
        "rope.dimension_count": rope_dim,
        "vocab_size": config.vocab_size,
    }
    if local_rope:
        m["rope.freq_base_swa"] = float(local_rope["rope_theta"])
    if family.swa_period and getattr(config, "sliding_window", None):
        period = family.swa_period
        pattern = ["sliding_attention" if i % period < period - 1 else "full_attention" for i in range(config.num_hidden_layers)]
        if getattr(config, "layer_types", None) and list(config.layer_types) != pattern:
            raise ValueError(f"{arch}'s layer pattern is {pattern}, the config has {config.layer_types}")
        m["attention.sliding_window"] = int(config.sliding_window)
    scalar = getattr(config, "query_pre_attn_scalar", None)
    if scalar and scalar != head_dim:
        m["attention.scale"] = float(scalar) ** -0.5
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, key, None):
            m[key] = float(getattr(config, key))
    metadata = {f"{arch}.{k}": v for k, v in m.items()}
    offset = family.hf_norm_offset
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": t("model.embed_tokens.weight"),
        "output_norm.weight": t("model.norm.weight") + offset,
    }
    if not config.tie_word_embeddings:
        tensors["output.weight"] = t("lm_head.weight")
    names = {**_LAYER_NAMES, **_POST_NORMS[family.post_norms]}
    for i in range(config.num_hidden_layers):
        hf = f"model.layers.{i}."
        for key in state_dict:
            if not key.startswith(hf):
                continue
            module, _, kind = key[len(hf):].rpartition(".")
            if module not in names:
                raise ValueError(f"{key}: no GGUF name for {module!r} in {arch}")
            value = t(key)
            if "norm" in module:
                value = value + offset
            tensors[f"blk.{i}.{names[module]}.{kind}"] = value
    return metadata, tensors


def write_family_gguf(path: str | os.PathLike[str], arch: str, model: Any, *, tokenizer: Mapping[str, Any] | None = None,
                      quantize: Mapping[str, Any] | None = None) -> str:
    """Write a HF model of a family in ``families.FAMILIES`` as its GGUF (float32 tensors;
    ``quantize`` as ``write_llama_gguf`` takes it)."""
    if arch == "llama":
        return write_llama_gguf(path, model, tokenizer=tokenizer, quantize=quantize)
    metadata, tensors = family_gguf_contents(arch, model.config, model.state_dict())
    if quantize:
        for name, array in list(tensors.items()):
            kind = next((k for frag, k in quantize.items() if frag == "*" or frag in name), None)
            if array.ndim == 2 and kind is not None:
                tensors[name] = (array, kind)
    return write_gguf(path, arch, metadata, tensors, tokenizer=tokenizer)
