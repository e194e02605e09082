"""HF DFlash checkpoints -> GGUF ``dflash`` drafter files.

Two source layouts are recognised by their tensor names, never by a model name:

* z-lab (``dflash/model.py``, a Qwen3 config with a ``dflash_config`` table): ``fc``,
  ``hidden_norm``, ``norm``, ``layers.N.*``; DFlash2 adds ``layers.N.{attention,mlp}_conv.*``
  and ``candidate_selector.*`` and the target's logit transform as ``output_multiplier`` /
  ``final_logit_softcapping``.
* transformers' ``muse_glimmer_assistant``: ``encoder.fc``, ``encoder.output_norm_enc``,
  ``norm``, ``layers.N.*`` (optionally under ``model.``), with ``target_layer_ids``,
  ``block_size``, ``mask_token_id`` at the top of the config.

Layer ids: HF ``target_layer_ids`` name layer OUTPUTS; the file stores ``id + 1``, the residual
ENTERING the next layer (model-specs trap 3). The sliding window is written as the config states
it; the runtime reads it with HF's inclusive convention (a key at distance <= window is seen).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tsspec.errors import ModelLoadError

from .config import MAIN_ARCH, hf_target_ids_to_gguf

__all__ = ["ConversionError", "gguf_from_state_dict", "convert_checkpoint", "detect_layout", "load_checkpoint"]

ZLAB, ASSISTANT = "z-lab", "muse_glimmer_assistant"
DEFAULT_BLOCK_SIZE = 16
OUT_TYPES = ("f32", "f16")

# HF per-layer name (after "layers.N.") -> GGUF name (after "blk.N.")
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "attention_conv.base_kernel": "attn_conv_base.weight",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base.weight",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}
GLOBAL_MAP = {
    ZLAB: {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight", "norm.weight": "output_norm.weight"},
    ASSISTANT: {
        "encoder.fc.weight": "fc.weight",
        "encoder.output_norm_enc.weight": "enc.output_norm.weight",
        "norm.weight": "output_norm.weight",
    },
}
# keyed without ".weight": z-lab stores the codebooks bare and the projection with the suffix
SELECTOR_MAP = {
    "candidate_selector.hidden_projection": "selector_hidden.weight",
    "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
    "candidate_selector.successor_codebook": "selector_successor.weight",
}
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")


class ConversionError(ModelLoadError):
    """The checkpoint cannot be converted; the message names the source and the problem."""


def _strip_prefix(name: str) -> str:
    return name[len("model.") :] if name.startswith("model.") else name


def detect_layout(names: Any) -> str:
    """``z-lab`` or ``muse_glimmer_assistant`` from the tensor names of a state dict."""
    stripped = {_strip_prefix(n) for n in names}
    if "encoder.fc.weight" in stripped:
        return ASSISTANT
    if "fc.weight" in stripped and "hidden_norm.weight" in stripped:
        return ZLAB
    raise ValueError(
        "not a DFlash checkpoint: expected 'fc.weight' + 'hidden_norm.weight' (z-lab) or "
        "'encoder.fc.weight' (transformers muse_glimmer_assistant)"
    )


def _dflash_value(config: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """A DFlash setting from ``dflash_config`` (z-lab) or the top level (transformers)."""
    table = config.get("dflash_config") or {}
    if name in table:
        return table[name]
    return config.get(name, default)


def _rope_base(config: Mapping[str, Any], fail) -> float:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default")) if params else "default"
    if kind not in ("default", None):
        raise fail(f"rope_type {kind!r} is not supported for DFlash drafters (plain NeoX RoPE only)")
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0)))


def gguf_metadata(config: Mapping[str, Any], fc_in: int, layout: str, fail, *,
                  logit_scale: float | None = None, softcap: float | None = None) -> dict[str, Any]:
    """The ``dflash.*`` metadata for an HF config (values are python; types chosen on write)."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    layers = int(config["num_hidden_layers"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    ids = _dflash_value(config, "target_layer_ids")
    if not ids:
        raise fail("the config names no target_layer_ids")
    mask = _dflash_value(config, "mask_token_id")
    if mask is None:
        raise fail("the config names no mask_token_id")
    if fc_in % len(ids):
        raise fail(f"fc input width {fc_in} is not a multiple of {len(ids)} target layers")
    if float(_dflash_value(config, "input_embedding_scale", 1.0)) != 1.0:
        raise fail("input_embedding_scale != 1 is not representable in a dflash GGUF")
    layer_types = config.get("layer_types") or []
    window = config.get("sliding_window")
    if layer_types:
        sliding = [t == "sliding_attention" for t in layer_types]
    elif window and config.get("use_sliding_window", True):
        sliding = [True] * layers
    else:
        sliding = [False] * layers
    causal = config.get("is_causal")
    if layout == ZLAB and (causal is True or (causal is None and any(sliding))):
        raise fail("this z-lab drafter attends causally inside the block; only non-causal DFlash blocks are supported")
    meta: dict[str, Any] = {
        "block_count": layers,
        "embedding_length": hidden,
        "feed_forward_length": int(config["intermediate_size"]),
        "attention.head_count": heads,
        "attention.head_count_kv": int(config.get("num_key_value_heads") or heads),
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "rope.freq_base": _rope_base(config, fail),
        "attention.layer_norm_rms_epsilon": float(config.get("rms_norm_eps", 1e-6)),
        "block_size": int(_dflash_value(config, "block_size", DEFAULT_BLOCK_SIZE)),
        "target_layers": hf_target_ids_to_gguf(ids),
        "target_hidden_size": fc_in // len(ids),
    }
    if any(sliding) and window:
        meta["attention.sliding_window"] = int(window)
        meta["attention.sliding_window_pattern"] = sliding
    for ours, theirs in (("conv_kernel_size", "conv_kernel_size"), ("conv_group_size", "conv_group_size"),
                         ("selector_rank", "selector_rank"), ("selector_top_k", "selector_top_k")):
        value = _dflash_value(config, theirs)
        if value is not None:
            meta[ours] = int(value)
    scale = logit_scale if logit_scale is not None else _dflash_value(config, "output_multiplier", None)
    if scale is None:
        scale = _dflash_value(config, "logit_scale", None)
    cap = softcap if softcap is not None else _dflash_value(config, "final_logit_softcapping", None)
    if scale is not None and float(scale) != 1.0:
        meta["logit_scale"] = float(scale)
    if cap:
        meta["final_logit_softcapping"] = float(cap)
    if config.get("vocab_size"):
        meta["vocab_size"] = int(config["vocab_size"])
    meta["__mask_token_id__"] = int(mask)
    return meta


def gguf_tensors(state_dict: Mapping[str, Any], layout: str, fail) -> dict[str, np.ndarray]:
    """HF tensors renamed to GGUF names, as float32 numpy arrays (numpy order)."""
    out: dict[str, np.ndarray] = {}
    for raw_name, tensor in state_dict.items():
        name = _strip_prefix(raw_name)
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name.removesuffix(".weight") in SELECTOR_MAP:
            gguf_name = SELECTOR_MAP[name.removesuffix(".weight")]
        elif name in GLOBAL_MAP[layout]:
            gguf_name = GLOBAL_MAP[layout][name]
        else:
            match = _LAYER_RE.match(name)
            if not match or match.group(2) not in LAYER_MAP:
                raise fail(f"unexpected tensor {raw_name!r} in a {layout} DFlash checkpoint")
            gguf_name = f"blk.{match.group(1)}.{LAYER_MAP[match.group(2)]}"
        out[gguf_name] = _to_numpy(tensor)
    for needed in GLOBAL_MAP[layout].values():
        if needed not in out:
            raise fail(f"the checkpoint has no tensor for {needed!r}")
    return out


def _to_numpy(tensor: Any) -> np.ndarray:
    if hasattr(tensor, "detach"):
        import torch

        return tensor.detach().to(torch.float32).cpu().numpy()
    return np.asarray(tensor, dtype=np.float32)


def write_gguf(path: str | Path, meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray], *,
               out_type: str = "f32", name: str | None = None) -> None:
    """Write a ``dflash`` GGUF. Norms and 1-D tensors stay float32 whatever ``out_type``."""
    import gguf

    if out_type not in OUT_TYPES:
        raise ValueError(f"out_type must be one of {OUT_TYPES}, got {out_type!r}")
    writer = gguf.GGUFWriter(str(path), MAIN_ARCH)
    if name:
        writer.add_name(name)
    for key, value in meta.items():
        full = f"{MAIN_ARCH}.{key}"
        if key == "__mask_token_id__":
            writer.add_mask_token_id(int(value))
        elif isinstance(value, bool):
            writer.add_bool(full, value)
        elif isinstance(value, int):
            writer.add_uint32(full, value)
        elif isinstance(value, float):
            writer.add_float32(full, value)
        elif isinstance(value, list):
            writer.add_array(full, value)
        else:
            raise TypeError(f"cannot write {full}={value!r}")
    for tname in sorted(tensors):
        array = np.ascontiguousarray(tensors[tname], dtype=np.float32)
        if out_type == "f16" and array.ndim > 1:
            array = array.astype(np.float16)
        writer.add_tensor(tname, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_from_state_dict(
    state_dict: Mapping[str, Any],
    config: Mapping[str, Any],
    out_path: str | Path,
    *,
    out_type: str = "f32",
    logit_scale: float | None = None,
    softcap: float | None = None,
    source: str = "<state dict>",
) -> str:
    """Convert an in-memory checkpoint; returns the layout it recognised."""

    def fail(problem: str) -> ConversionError:
        return ConversionError(source, problem)

    try:
        layout = detect_layout(state_dict.keys())
    except ValueError as exc:
        raise fail(str(exc)) from None
    tensors = gguf_tensors(state_dict, layout, fail)
    fc_in = int(tensors["fc.weight"].shape[1])
    meta = gguf_metadata(config, fc_in, layout, fail, logit_scale=logit_scale, softcap=softcap)
    write_gguf(out_path, meta, tensors, out_type=out_type, name=config.get("_name_or_path") or None)
    return layout


def load_checkpoint(source: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state dict, config dict) from an HF directory: config.json plus safetensors shards."""
    root = Path(source)

    def fail(problem: str) -> ConversionError:
        return ConversionError(str(root), problem)

    config_path = root / "config.json"
    if not config_path.is_file():
        raise fail("no config.json (expected an HF checkpoint directory)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise fail(f"config.json is unreadable ({exc})") from None
    shards = sorted(root.glob("*.safetensors"))
    if not shards:
        raise fail("no *.safetensors files")
    try:
        from safetensors.torch import load_file
    except ImportError:  # pragma: no cover - safetensors is a declared extra
        raise fail("the 'safetensors' package is needed to read HF checkpoints (pip install safetensors)") from None
    state: dict[str, Any] = {}
    for shard in shards:
        try:
            state.update(load_file(str(shard)))
        except Exception as exc:  # a corrupt shard is one line, not a traceback
            raise fail(f"{shard.name}: {exc}") from None
    return state, config


def convert_checkpoint(
    source: str | Path,
    out_path: str | Path,
    *,
    out_type: str = "f32",
    logit_scale: float | None = None,
    softcap: float | None = None,
) -> str:
    """Convert an HF DFlash checkpoint directory to ``out_path``; returns the layout."""
    state, config = load_checkpoint(source)
    return gguf_from_state_dict(
        state, config, out_path, out_type=out_type, logit_scale=logit_scale, softcap=softcap, source=str(source)
    )
