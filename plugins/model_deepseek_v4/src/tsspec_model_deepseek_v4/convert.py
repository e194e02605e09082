"""Hugging Face DeepSeek V4 checkpoints -> GGUF ``deepseek4`` (llama.cpp's names), MTP block included.

``convert_state_dict(config, state_dict) -> (arch, metadata, tensors)`` is the whole mapping;
``convert_hf_dir`` reads ``config.json`` and the safetensors shards and writes the file; it is
the converter registered for ``model_type = deepseek_v4`` through ``tsspec_register_converters``.

Two checkpoint namings are accepted and may be mixed: DeepSeek's own (``layers.N.attn.wq_a``,
``layers.N.ffn.experts.E.w1``, ``mtp.0.*``: what the released repositories hold) and
transformers' in-memory names (``model.layers.N.self_attn.q_a_proj``, fused
``mlp.experts.gate_up_proj``); ``save_pretrained`` writes DeepSeek's names under ``model.``, with
the attention's ``kv_norm`` as ``attn.norm``: accepted too. transformers ignores ``mtp.*`` on load, so an MTP block only ever
comes in DeepSeek's naming; it becomes block ``L = num_hidden_layers`` with its extra tensors
under ``blk.L.nextn.*`` (``e_proj``, ``h_proj``, ``enorm``, ``hnorm``, ``shared_head_norm`` (the
block's final ``norm``), ``hc_head_{fn,base,scale}``), and ``nextn_predict_layers`` counts it.

Norms are plain ``x_hat * w`` in both worlds (nothing to fold). FP8 / FP4 checkpoints (tensors
with a ``.scale`` companion) are refused: dequantise them first. Tokenizers are not converted
(the file is token-id only).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .hparams import ARCHITECTURE

__all__ = ["convert_state_dict", "convert_hf_dir", "ConversionError", "canonical_names", "config_facts"]

LAYER_TYPE_RATIO_KEYS = {"compressed_sparse_attention": "compressed_sparse_attention",
                         "heavily_compressed_attention": "heavily_compressed_attention"}
DEFAULT_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
SCORING_IDS = {"softmax": 1, "sigmoid": 2, "sqrtsoftplus": 4}


class ConversionError(ValueError):
    """A checkpoint this converter cannot map (one line, names the problem)."""


# transformers' names -> DeepSeek's names (applied in order, on the part after ``layers.N.``)
_HF_TO_DS = [
    (r"^self_attn\.compressor\.indexer\.scorer\.weights_proj\.", "attn.indexer.weights_proj."),
    (r"^self_attn\.compressor\.indexer\.q_b_proj\.", "attn.indexer.wq_b."),
    (r"^self_attn\.compressor\.indexer\.", "attn.indexer.compressor."),
    (r"^self_attn\.compressor\.", "attn.compressor."),
    (r"^self_attn\.q_a_proj\.", "attn.wq_a."),
    (r"^self_attn\.q_a_norm\.", "attn.q_norm."),
    (r"^self_attn\.q_b_proj\.", "attn.wq_b."),
    (r"^self_attn\.kv_proj\.", "attn.wkv."),
    (r"^self_attn\.kv_norm\.", "attn.kv_norm."),
    (r"^self_attn\.o_a_proj\.", "attn.wo_a."),
    (r"^self_attn\.o_b_proj\.", "attn.wo_b."),
    (r"^self_attn\.sinks$", "attn.attn_sink"),
    (r"^input_layernorm\.", "attn_norm."),
    (r"^post_attention_layernorm\.", "ffn_norm."),
    (r"^attn_hc\.(fn|base|scale)$", r"hc_attn_\1"),
    (r"^ffn_hc\.(fn|base|scale)$", r"hc_ffn_\1"),
    (r"^mlp\.gate\.e_score_correction_bias$", "ffn.gate.bias"),
    (r"^mlp\.gate\.", "ffn.gate."),
    (r"^mlp\.shared_experts\.gate_proj\.", "ffn.shared_experts.w1."),
    (r"^mlp\.shared_experts\.up_proj\.", "ffn.shared_experts.w3."),
    (r"^mlp\.shared_experts\.down_proj\.", "ffn.shared_experts.w2."),
    (r"^mlp\.experts\.gate_up_proj$", "ffn.experts.gate_up"),
    (r"^mlp\.experts\.down_proj$", "ffn.experts.down"),
]
_HF_COMPRESSOR_LEAF = {"kv_proj.weight": "wkv.weight", "gate_proj.weight": "wgate.weight", "position_bias": "ape",
                       "kv_norm.weight": "norm.weight"}
_COMPRESSOR_SUFFIX = {"wkv.weight": "kv.weight", "wgate.weight": "gate.weight", "ape": "ape.weight",
                      "norm.weight": "norm.weight"}
_BLOCK = {
    "attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
    "attn.wq_a.weight": "attn_q_a.weight", "attn.q_norm.weight": "attn_q_a_norm.weight",
    "attn.wq_b.weight": "attn_q_b.weight", "attn.wkv.weight": "attn_kv.weight",
    "attn.kv_norm.weight": "attn_kv_a_norm.weight", "attn.wo_a.weight": "attn_output_a.weight",
    "attn.wo_b.weight": "attn_output_b.weight", "attn.attn_sink": "attn_sinks.weight",
    "attn.indexer.wq_b.weight": "indexer.attn_q_b.weight", "attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "hc_attn_fn": "hc_attn_fn.weight", "hc_attn_base": "hc_attn_base.weight", "hc_attn_scale": "hc_attn_scale.weight",
    "hc_ffn_fn": "hc_ffn_fn.weight", "hc_ffn_base": "hc_ffn_base.weight", "hc_ffn_scale": "hc_ffn_scale.weight",
    "ffn.gate.weight": "ffn_gate_inp.weight", "ffn.gate.bias": "exp_probs_b.bias",
    "ffn.gate.tid2eid": "ffn_gate_tid2eid.weight",
    "ffn.shared_experts.w1.weight": "ffn_gate_shexp.weight", "ffn.shared_experts.w3.weight": "ffn_up_shexp.weight",
    "ffn.shared_experts.w2.weight": "ffn_down_shexp.weight",
}
_MTP_EXTRA = {"e_proj.weight": "nextn.e_proj.weight", "h_proj.weight": "nextn.h_proj.weight",
              "enorm.weight": "nextn.enorm.weight", "hnorm.weight": "nextn.hnorm.weight",
              "norm.weight": "nextn.shared_head_norm.weight", "hc_head_fn": "nextn.hc_head_fn.weight",
              "hc_head_base": "nextn.hc_head_base.weight", "hc_head_scale": "nextn.hc_head_scale.weight"}
_TOP = {"embed.weight": "token_embd.weight", "head.weight": "output.weight", "norm.weight": "output_norm.weight",
        "hc_head_fn": "output_hc_fn.weight", "hc_head_base": "output_hc_base.weight",
        "hc_head_scale": "output_hc_scale.weight"}
_HF_TOP = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
           "model.norm.weight": "norm.weight", "model.hc_head.hc_fn": "hc_head_fn",
           "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}


def canonical_names(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor under DeepSeek's own name (transformers' names translated)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key in _HF_TOP:
            out[_HF_TOP[key]] = value
            continue
        m = re.match(r"^(model\.layers|mtp)\.(\d+)\.(.*)$", key)
        if m:
            rest = m.group(3)
            for pattern, repl in _HF_TO_DS:
                new, count = re.subn(pattern, repl, rest)
                if count:
                    rest = new
                    break
            if rest == "attn.norm.weight":  # save_pretrained's reverse renaming of attn.kv_norm
                rest = "attn.kv_norm.weight"
            c = re.match(r"^(attn\.(?:indexer\.)?compressor\.)(.*)$", rest)
            if c and c.group(2) in _HF_COMPRESSOR_LEAF:
                rest = c.group(1) + _HF_COMPRESSOR_LEAF[c.group(2)]
            prefix = "layers" if m.group(1) == "model.layers" else "mtp"
            out[f"{prefix}.{m.group(2)}.{rest}"] = value
            continue
        out[key] = value
    return out


def config_facts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config's facts under one naming (transformers' current and legacy keys)."""
    n = int(cfg["num_hidden_layers"])
    nextn = int(cfg.get("num_nextn_predict_layers", 0) or 0)
    rates = dict(DEFAULT_RATES)
    rates.update(cfg.get("compress_rates") or {})
    if cfg.get("compress_rate_csa"):
        rates["compressed_sparse_attention"] = int(cfg["compress_rate_csa"])
    if cfg.get("compress_rate_hca"):
        rates["heavily_compressed_attention"] = int(cfg["compress_rate_hca"])
    if cfg.get("layer_types"):
        types = list(cfg["layer_types"])[:n]
        ratios = [0 if t == "sliding_attention" else int(rates[t]) for t in types]
        indexed = [t == "compressed_sparse_attention" for t in types]
    elif cfg.get("compress_ratios"):
        ratios = [int(r) for r in cfg["compress_ratios"]][:n]
        indexed = [r == rates["compressed_sparse_attention"] for r in ratios]
    else:
        types = ["heavily_compressed_attention"] * min(n, 2) + [
            "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(n - 2, 0))]
        ratios = [int(rates[t]) for t in types]
        indexed = [t == "compressed_sparse_attention" for t in types]
    if cfg.get("mlp_layer_types"):
        hash_layers = sum(1 for t in list(cfg["mlp_layer_types"])[:n] if t == "hash_moe")
        if list(cfg["mlp_layer_types"])[:hash_layers] != ["hash_moe"] * hash_layers:
            raise ConversionError("hash_moe layers must come first (hash_layer_count)")
    else:
        hash_layers = int(cfg.get("num_hash_layers", 3))
    head_dim = int(cfg["head_dim"])
    if cfg.get("qk_rope_head_dim"):
        rope_dims = int(cfg["qk_rope_head_dim"])
    else:
        rope_dims = int(head_dim * float(cfg.get("partial_rotary_factor") or 64 / 512))
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    compress_rp = rp.get("compress", rp) if isinstance(rp, dict) else {}
    rope_theta = float((rp.get("main") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)))
    compress_theta = float(compress_rp.get("rope_theta", cfg.get("compress_rope_theta", 160000.0)))
    yarn = None
    if (compress_rp.get("rope_type") or compress_rp.get("type")) == "yarn":
        yarn = {"factor": float(compress_rp["factor"]),
                "original_context": int(compress_rp["original_max_position_embeddings"]),
                "beta_fast": float(compress_rp.get("beta_fast") or 32), "beta_slow": float(compress_rp.get("beta_slow") or 1)}
    scoring = str(cfg.get("scoring_func", "sqrtsoftplus"))
    if scoring not in SCORING_IDS:
        raise ConversionError(f"scoring_func {scoring!r} is not one of {', '.join(SCORING_IDS)}")
    return dict(
        n=n, nextn=nextn, ratios=ratios, indexed=indexed, hash_layers=hash_layers, head_dim=head_dim,
        rope_dims=rope_dims, rope_theta=rope_theta, compress_theta=compress_theta, yarn=yarn, scoring=scoring,
    )


class _Converter:
    def __init__(self, cfg: dict[str, Any], state_dict: Mapping[str, torch.Tensor]):
        scaled = [k for k in state_dict if k.endswith(".scale") and k[: -len("scale")] + "weight" in state_dict]
        if scaled:
            raise ConversionError(f"{scaled[0]!r}: FP8 / FP4 checkpoints are not supported; dequantise to bf16/f32 first")
        self.cfg = cfg
        self.f = config_facts(cfg)
        self.sd = canonical_names(state_dict)
        self.used: set[str] = set()
        self.out: dict[str, np.ndarray] = {}

    def take(self, key: str) -> torch.Tensor:
        if key not in self.sd:
            raise ConversionError(f"missing checkpoint tensor {key!r}")
        self.used.add(key)
        return self.sd[key]

    def put(self, name: str, value: torch.Tensor, *, integer: bool = False) -> None:
        array = value.detach().to(torch.float64 if integer else torch.float32).cpu().numpy()
        self.out[name] = array.astype(np.int32) if integer else array

    def block(self, src: str, dst: str, *, experts: int) -> None:
        for key in [k for k in self.sd if k.startswith(src)]:
            rest = key[len(src):]
            if rest in _BLOCK:
                self.put(f"{dst}{_BLOCK[rest]}", self.take(key), integer=rest == "ffn.gate.tid2eid")
                continue
            m = re.match(r"^attn\.(indexer\.)?compressor\.(.*)$", rest)
            if m and m.group(2) in _COMPRESSOR_SUFFIX:
                base = "indexer_compressor_" if m.group(1) else "attn_compressor_"
                self.put(f"{dst}{base}{_COMPRESSOR_SUFFIX[m.group(2)]}", self.take(key))
        if f"{src}ffn.experts.gate_up" in self.sd:
            gate, up = self.take(f"{src}ffn.experts.gate_up").chunk(2, dim=1)
            down = self.take(f"{src}ffn.experts.down")
        else:
            gate = torch.stack([self.take(f"{src}ffn.experts.{e}.w1.weight") for e in range(experts)])
            up = torch.stack([self.take(f"{src}ffn.experts.{e}.w3.weight") for e in range(experts)])
            down = torch.stack([self.take(f"{src}ffn.experts.{e}.w2.weight") for e in range(experts)])
        self.put(f"{dst}ffn_gate_exps.weight", gate)
        self.put(f"{dst}ffn_up_exps.weight", up)
        self.put(f"{dst}ffn_down_exps.weight", down)

    def run(self) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
        c, f, a = self.cfg, self.f, ARCHITECTURE
        experts = int(c["n_routed_experts"])
        for key, name in _TOP.items():
            if key in self.sd:
                self.put(name, self.take(key))
        for i in range(f["n"]):
            self.block(f"layers.{i}.", f"blk.{i}.", experts=experts)
        mtp = sorted({int(m.group(1)) for k in self.sd if (m := re.match(r"^mtp\.(\d+)\.", k))})
        for j in mtp:
            dst = f"blk.{f['n'] + j}."
            for extra, name in _MTP_EXTRA.items():
                self.put(f"{dst}{name}", self.take(f"mtp.{j}.{extra}"))
            self.block(f"mtp.{j}.", dst, experts=experts)
        tied = "head.weight" not in self.sd
        unused = sorted(set(self.sd) - self.used)
        if unused:
            raise ConversionError(f"{len(unused)} checkpoint tensors were not mapped, e.g. {unused[:3]}")
        meta: dict[str, Any] = {
            f"{a}.vocab_size": int(c["vocab_size"]),
            f"{a}.context_length": int(c.get("max_position_embeddings", 4096)),
            f"{a}.embedding_length": int(c["hidden_size"]),
            f"{a}.block_count": f["n"] + len(mtp),
            f"{a}.nextn_predict_layers": len(mtp),
            f"{a}.attention.head_count": int(c["num_attention_heads"]),
            f"{a}.attention.head_count_kv": 1,
            f"{a}.attention.key_length": f["head_dim"],
            f"{a}.attention.value_length": f["head_dim"],
            f"{a}.attention.q_lora_rank": int(c["q_lora_rank"]),
            f"{a}.attention.output_group_count": int(c["o_groups"]),
            f"{a}.attention.output_lora_rank": int(c["o_lora_rank"]),
            f"{a}.attention.sliding_window": int(c["sliding_window"]),
            f"{a}.attention.compress_ratios": list(f["ratios"]) + [0] * len(mtp),
            f"{a}.attention.indexer.types": [int(x) for x in f["indexed"]] + [0] * len(mtp),
            f"{a}.attention.compress_rope_freq_base": f["compress_theta"],
            f"{a}.attention.indexer.head_count": int(c.get("index_n_heads", 0)),
            f"{a}.attention.indexer.key_length": int(c.get("index_head_dim", 0)),
            f"{a}.attention.indexer.top_k": int(c.get("index_topk", 0)),
            f"{a}.attention.layer_norm_rms_epsilon": float(c.get("rms_norm_eps", 1e-6)),
            f"{a}.rope.dimension_count": f["rope_dims"],
            f"{a}.rope.freq_base": f["rope_theta"],
            f"{a}.expert_count": experts,
            f"{a}.expert_used_count": int(c["num_experts_per_tok"]),
            f"{a}.expert_shared_count": int(c.get("n_shared_experts", 1)),
            f"{a}.expert_feed_forward_length": int(c["moe_intermediate_size"]),
            f"{a}.expert_shared_feed_forward_length": int(c["moe_intermediate_size"]),
            f"{a}.expert_weights_scale": float(c.get("routed_scaling_factor", 1.0)),
            f"{a}.expert_weights_norm": True,
            f"{a}.expert_gating_func": SCORING_IDS[f["scoring"]],
            f"{a}.hash_layer_count": f["hash_layers"],
            f"{a}.swiglu_clamp_exp": float(c.get("swiglu_limit", 0.0) or 0.0),
            f"{a}.swiglu_clamp_shexp": float(c.get("swiglu_limit", 0.0) or 0.0),
            f"{a}.hyper_connection.count": int(c.get("hc_mult", 4)),
            f"{a}.hyper_connection.sinkhorn_iterations": int(c.get("hc_sinkhorn_iters", 20)),
            f"{a}.hyper_connection.epsilon": float(c.get("hc_eps", 1e-6)),
        }
        if f["yarn"]:
            y = f["yarn"]
            meta.update({f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": y["factor"],
                         f"{a}.rope.scaling.original_context_length": y["original_context"],
                         f"{a}.rope.scaling.yarn_beta_fast": y["beta_fast"],
                         f"{a}.rope.scaling.yarn_beta_slow": y["beta_slow"]})
        if tied and "token_embd.weight" not in self.out:
            raise ConversionError("missing checkpoint tensor 'embed.weight'")
        return a, meta, self.out


def convert_state_dict(config: Any, state_dict: Mapping[str, torch.Tensor]) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    """(GGUF architecture, metadata with full key names, tensors in numpy order)."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    if cfg.get("model_type", "deepseek_v4") != "deepseek_v4":
        raise ConversionError(f"model_type {cfg.get('model_type')!r} is not deepseek_v4")
    return _Converter(cfg, state_dict).run()


def _read_state_dict(src: Path) -> dict[str, torch.Tensor]:
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{src}: no *.safetensors files")
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def convert_hf_dir(src_dir: str | Path, out_path: str | Path, *, outtype: str = "f32") -> None:
    """The registered converter: ``converter(src_dir, out_path, *, outtype)``."""
    from gguf import GGMLQuantizationType

    from tsspec_gguf.gguf_writer_util import write_gguf

    src = Path(src_dir)
    config_file = src / "config.json"
    if not config_file.is_file():
        raise ConversionError(f"{src}: no config.json")
    config = json.loads(config_file.read_text())
    arch, meta, tensors = convert_state_dict(config, _read_state_dict(src))
    kinds = {"f32": None, "f16": GGMLQuantizationType.F16, "q8_0": GGMLQuantizationType.Q8_0}
    if outtype not in kinds:
        raise ConversionError(f"--outtype {outtype!r}: use f32, f16 or q8_0")
    out: dict[str, Any] = {}
    for name, value in tensors.items():
        kind = kinds[outtype]
        if value.dtype == np.int32 or kind is None or value.ndim < 2 or "hc_" in name or name.endswith("_ape.weight"):
            out[name] = value  # tables, norms, vectors and the hyper-connection maps stay exact
        elif kind == GGMLQuantizationType.Q8_0 and value.shape[-1] % 32:
            out[name] = (value, GGMLQuantizationType.F16)
        else:
            out[name] = (value, kind)
    _write(out_path, arch, meta, out, write_gguf)


def _write(path, arch, meta, tensors, write_gguf) -> None:
    """write_gguf stores non-float arrays as float32; the hash table must stay I32, so it goes
    through the writer's raw path (already-encoded bytes of type I32)."""
    from gguf import GGMLQuantizationType

    fixed = {}
    for name, value in tensors.items():
        if isinstance(value, np.ndarray) and value.dtype == np.int32:
            fixed[name] = (value.view(np.uint8).reshape(value.shape[0], -1), GGMLQuantizationType.I32)
        else:
            fixed[name] = value
    write_gguf(path, arch, meta, fixed)
