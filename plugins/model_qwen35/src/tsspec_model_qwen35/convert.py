"""Hugging Face Qwen 3.5 / 3.5-MoE / Qwen3-Next checkpoints -> GGUF, with llama.cpp's conventions.

``convert_state_dict(config, state_dict) -> (arch, metadata, tensors)`` is the whole mapping;
``convert_hf_dir`` reads ``config.json`` and the safetensors shards and writes the file. The
conventions that matter (llama.cpp's GGUF conventions and the three traps):

* +1 is folded into every Qwen RMSNorm weight (HF computes ``x_hat * (1 + w)``), EXCEPT the
  Gated DeltaNet output norm ``linear_attn.norm`` (plain ``x_hat * w`` in both worlds).
* ``ssm_a = -exp(A_log)``; ``ssm_conv1d`` is ``[conv_dim, K]``; ``attn_q`` keeps q and gate
  interleaved per head, exactly as ``q_proj`` stores them.
* qwen35 / qwen35moe store V heads TILED (value head j reads key head ``j % num_k``): the V rows
  of ``attn_qkv``, ``attn_gate``, ``ssm_beta``, ``ssm_alpha``, ``ssm_a``, ``ssm_dt``, the V
  channels of ``ssm_conv1d`` and the columns of ``ssm_out`` are permuted from HF's GROUPED
  order. qwen3next keeps the grouped order; its ``in_proj_qkvz`` (grouped per key head) is split
  into ``attn_qkv`` (all-Q | all-K | all-V) and ``attn_gate``, ``in_proj_ba`` becomes ``ssm_ba``.
* ``mtp.*`` weights become the NextN block at index L = num_hidden_layers (``block_count``
  counts it, ``nextn_predict_layers`` says how many there are).

Tokenizers are not converted: the file is token-id only (``tsspec generate`` takes ids).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .hparams import ARCH_QWEN35, ARCH_QWEN35MOE, ARCH_QWEN3NEXT, RECURRENT_LAYERS_KEY

__all__ = ["convert_state_dict", "convert_hf_dir", "ConversionError", "tiled_head_order"]

DEFAULT_MROPE_SECTIONS = [11, 11, 10]
ROPE_SECTION_SLOTS = 4  # llama.cpp reads 4 rope sections
_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.")


class ConversionError(ValueError):
    """The checkpoint is not a Qwen 3.5 / 3.5-MoE / Qwen3-Next text model, or is incomplete."""


def tiled_head_order(num_k: int, num_v: int) -> list[int]:
    """For each TILED value head j, the GROUPED (HF) head it comes from.

    >>> tiled_head_order(2, 4)   # HF heads 0,1 read key 0; 2,3 read key 1
    [0, 2, 1, 3]
    """
    r = num_v // num_k
    return [(j % num_k) * r + j // num_k for j in range(num_v)]


def _architecture(cfg: Mapping[str, Any]) -> str:
    model_type = str(cfg.get("model_type", ""))
    if model_type.startswith("qwen3_next"):
        return ARCH_QWEN3NEXT
    if model_type.startswith("qwen3_5_moe"):
        return ARCH_QWEN35MOE
    if model_type.startswith("qwen3_5"):
        return ARCH_QWEN35
    raise ConversionError(f"model_type {model_type!r} is not qwen3_5, qwen3_5_moe or qwen3_next")


def _text_config(config: Any) -> dict[str, Any]:
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    if isinstance(cfg.get("text_config"), Mapping):
        cfg = dict(cfg["text_config"])
    return cfg


def _rope(cfg: Mapping[str, Any], head_dim: int) -> tuple[float, int, list[int]]:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    base = float(params.get("rope_theta", cfg.get("rope_theta", 10_000.0)))
    factor = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    sections = list(params.get("mrope_section", DEFAULT_MROPE_SECTIONS))
    return base, int(head_dim * factor), (sections + [0] * ROPE_SECTION_SLOTS)[:ROPE_SECTION_SLOTS]


def _layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    if types:
        return list(types)[:n]
    interval = int(cfg.get("full_attention_interval", 4))
    return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]


def _interval_of(types: list[str]) -> int | None:
    """The full_attention_interval that reproduces ``types``, if one does."""
    for interval in range(1, len(types) + 1):
        if all((t == "full_attention") == ((i + 1) % interval == 0) for i, t in enumerate(types)):
            return interval
    return None


class _Converter:
    def __init__(self, cfg: dict[str, Any], state_dict: Mapping[str, torch.Tensor]):
        self.cfg = cfg
        self.arch = _architecture(cfg)
        self.sd = {self._normalise(k): v for k, v in state_dict.items()}
        self.sd = {k: v for k, v in self.sd.items() if k is not None}
        self.used: set[str] = set()
        self.out: dict[str, np.ndarray] = {}
        c = cfg
        self.H = int(c["hidden_size"])
        self.L = int(c["num_hidden_layers"])
        self.heads = int(c["num_attention_heads"])
        self.head_dim = int(c.get("head_dim") or self.H // self.heads)
        self.nk, self.nv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
        self.dk, self.dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
        self.K = int(c.get("linear_conv_kernel_dim", 4))
        self.types = _layer_types(c, self.L)
        self.tiled = self.arch in (ARCH_QWEN35, ARCH_QWEN35MOE)

    @staticmethod
    def _normalise(key: str) -> str | None:
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key = "model." + key[len(prefix):]
                break
        if key.startswith(("model.visual.", "visual.")):
            return None
        return key

    # -- helpers ----------------------------------------------------------------------------
    def take(self, key: str) -> torch.Tensor:
        if key not in self.sd:
            raise ConversionError(f"the checkpoint has no {key!r}")
        self.used.add(key)
        return self.sd[key].detach().to(torch.float32)

    def put(self, name: str, value: torch.Tensor) -> None:
        self.out[name] = np.ascontiguousarray(value.to(torch.float32).cpu().numpy())

    def norm(self, key: str, name: str) -> None:
        self.put(name, self.take(key) + 1.0)  # Qwen RMSNorm is x_hat * (1 + w): fold the +1

    def v_heads(self, t: torch.Tensor, dim: int, per_head: int) -> torch.Tensor:
        """Reorder value heads along ``dim`` (blocks of ``per_head``) from grouped to tiled."""
        if not self.tiled or self.nk == self.nv:
            return t
        order = torch.tensor(tiled_head_order(self.nk, self.nv))
        shape = list(t.shape)
        blocks = t.reshape(shape[:dim] + [self.nv, per_head] + shape[dim + 1:])
        return blocks.index_select(dim, order).reshape(shape)

    # -- blocks -----------------------------------------------------------------------------
    def attention(self, src: str, dst: str) -> None:
        for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            self.put(f"{dst}.{gg}.weight", self.take(f"{src}.self_attn.{hf}.weight"))
        self.norm(f"{src}.self_attn.q_norm.weight", f"{dst}.attn_q_norm.weight")
        self.norm(f"{src}.self_attn.k_norm.weight", f"{dst}.attn_k_norm.weight")

    def deltanet(self, src: str, dst: str) -> None:
        a = f"{src}.linear_attn"
        key_dim, value_dim = self.nk * self.dk, self.nv * self.dv
        if self.arch == ARCH_QWEN3NEXT:
            r = self.nv // self.nk
            grouped = self.take(f"{a}.in_proj_qkvz.weight").reshape(self.nk, 2 * self.dk + 2 * r * self.dv, self.H)
            q, k, v, z = grouped.split([self.dk, self.dk, r * self.dv, r * self.dv], dim=1)
            qkv = torch.cat([q.reshape(key_dim, self.H), k.reshape(key_dim, self.H), v.reshape(value_dim, self.H)])
            self.put(f"{dst}.attn_qkv.weight", qkv)
            self.put(f"{dst}.attn_gate.weight", z.reshape(value_dim, self.H))
            self.put(f"{dst}.ssm_ba.weight", self.take(f"{a}.in_proj_ba.weight"))
        else:
            qkv = self.take(f"{a}.in_proj_qkv.weight")
            qk, v = qkv.split([2 * key_dim, value_dim])
            self.put(f"{dst}.attn_qkv.weight", torch.cat([qk, self.v_heads(v, 0, self.dv)]))
            self.put(f"{dst}.attn_gate.weight", self.v_heads(self.take(f"{a}.in_proj_z.weight"), 0, self.dv))
            self.put(f"{dst}.ssm_beta.weight", self.v_heads(self.take(f"{a}.in_proj_b.weight"), 0, 1))
            self.put(f"{dst}.ssm_alpha.weight", self.v_heads(self.take(f"{a}.in_proj_a.weight"), 0, 1))
        conv = self.take(f"{a}.conv1d.weight").reshape(2 * key_dim + value_dim, -1)  # [conv_dim, K]
        conv_qk, conv_v = conv.split([2 * key_dim, value_dim])
        self.put(f"{dst}.ssm_conv1d.weight", torch.cat([conv_qk, self.v_heads(conv_v, 0, self.dv)]))
        self.put(f"{dst}.ssm_dt.bias", self.v_heads(self.take(f"{a}.dt_bias"), 0, 1))
        self.put(f"{dst}.ssm_a", self.v_heads(-torch.exp(self.take(f"{a}.A_log")), 0, 1))
        self.put(f"{dst}.ssm_norm.weight", self.take(f"{a}.norm.weight"))  # plain: no +1
        self.put(f"{dst}.ssm_out.weight", self.v_heads(self.take(f"{a}.out_proj.weight"), 1, self.dv))

    def ffn(self, src: str, dst: str) -> None:
        m = f"{src}.mlp"
        if f"{m}.gate_proj.weight" in self.sd:
            for hf, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                self.put(f"{dst}.{gg}.weight", self.take(f"{m}.{hf}.weight"))
            return
        self.put(f"{dst}.ffn_gate_inp.weight", self.take(f"{m}.gate.weight"))
        if f"{m}.experts.gate_up_proj" in self.sd:  # transformers' fused [E, 2F, H]
            gate, up = self.take(f"{m}.experts.gate_up_proj").chunk(2, dim=1)
            down = self.take(f"{m}.experts.down_proj")
        else:  # checkpoint layout: one module per expert
            ids = sorted({int(x.group(1)) for k in self.sd if (x := re.match(rf"{re.escape(m)}\.experts\.(\d+)\.", k))})
            if not ids:
                raise ConversionError(f"no dense or expert FFN weights under {m!r}")
            gate = torch.stack([self.take(f"{m}.experts.{e}.gate_proj.weight") for e in ids])
            up = torch.stack([self.take(f"{m}.experts.{e}.up_proj.weight") for e in ids])
            down = torch.stack([self.take(f"{m}.experts.{e}.down_proj.weight") for e in ids])
        self.put(f"{dst}.ffn_gate_exps.weight", gate)
        self.put(f"{dst}.ffn_up_exps.weight", up)
        self.put(f"{dst}.ffn_down_exps.weight", down)
        if f"{m}.shared_expert.gate_proj.weight" in self.sd:
            for hf, gg in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"), ("down_proj", "ffn_down_shexp")):
                self.put(f"{dst}.{gg}.weight", self.take(f"{m}.shared_expert.{hf}.weight"))
            self.put(f"{dst}.ffn_gate_inp_shexp.weight", self.take(f"{m}.shared_expert_gate.weight").reshape(-1))

    def layer(self, src: str, dst: str, linear: bool) -> None:
        self.norm(f"{src}.input_layernorm.weight", f"{dst}.attn_norm.weight")
        self.norm(f"{src}.post_attention_layernorm.weight", f"{dst}.post_attention_norm.weight")
        (self.deltanet if linear else self.attention)(src, dst)
        self.ffn(src, dst)

    def mtp(self) -> int:
        ids = sorted({int(x.group(1)) for k in self.sd if (x := re.match(r"mtp\.layers\.(\d+)\.", k))})
        if "mtp.fc.weight" not in self.sd or not ids:
            return 0
        if len(ids) > 1:
            raise ConversionError(f"{len(ids)} MTP layers: only one NextN block is supported")
        dst = f"blk.{self.L}"
        self.put(f"{dst}.nextn.eh_proj.weight", self.take("mtp.fc.weight"))
        self.norm("mtp.pre_fc_norm_embedding.weight", f"{dst}.nextn.enorm.weight")
        self.norm("mtp.pre_fc_norm_hidden.weight", f"{dst}.nextn.hnorm.weight")
        self.norm("mtp.norm.weight", f"{dst}.nextn.shared_head_norm.weight")
        self.layer("mtp.layers.0", dst, linear=False)
        return len(ids)

    # -- the whole model --------------------------------------------------------------------
    def run(self) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
        c, arch = self.cfg, self.arch
        embed = self.take("model.embed_tokens.weight")
        self.put("token_embd.weight", embed)
        self.norm("model.norm.weight", "output_norm.weight")
        tied = bool(c.get("tie_word_embeddings", False))
        if "lm_head.weight" in self.sd and not tied:
            self.put("output.weight", self.take("lm_head.weight"))
        for i, kind in enumerate(self.types):
            self.layer(f"model.layers.{i}", f"blk.{i}", kind == "linear_attention")
        nextn = self.mtp()
        base, rot, sections = _rope(c, self.head_dim)
        meta: dict[str, Any] = {
            "general.name": str(c.get("_name_or_path") or c.get("model_type")),
            f"{arch}.context_length": int(c.get("max_position_embeddings", 4096)),
            f"{arch}.embedding_length": self.H,
            f"{arch}.block_count": self.L + nextn,
            f"{arch}.attention.head_count": self.heads,
            f"{arch}.attention.head_count_kv": int(c.get("num_key_value_heads", self.heads)),
            f"{arch}.attention.key_length": self.head_dim,
            f"{arch}.attention.value_length": self.head_dim,
            f"{arch}.attention.layer_norm_rms_epsilon": float(c.get("rms_norm_eps", 1e-6)),
            f"{arch}.rope.freq_base": base,
            f"{arch}.rope.dimension_count": rot,
            f"{arch}.ssm.conv_kernel": self.K,
            f"{arch}.ssm.state_size": self.dk,
            f"{arch}.ssm.group_count": self.nk,
            f"{arch}.ssm.time_step_rank": self.nv,
            f"{arch}.ssm.inner_size": self.nv * self.dv,
        }
        if arch != ARCH_QWEN3NEXT:
            meta[f"{arch}.rope.dimension_sections"] = sections
        interval = _interval_of(self.types)
        if interval is not None:
            meta[f"{arch}.full_attention_interval"] = interval
        else:
            meta[f"{arch}.{RECURRENT_LAYERS_KEY}"] = [t == "linear_attention" for t in self.types]
        if c.get("intermediate_size"):
            meta[f"{arch}.feed_forward_length"] = int(c["intermediate_size"])
        if c.get("num_experts"):
            meta[f"{arch}.expert_count"] = int(c["num_experts"])
            meta[f"{arch}.expert_used_count"] = int(c["num_experts_per_tok"])
            meta[f"{arch}.expert_feed_forward_length"] = int(c["moe_intermediate_size"])
            meta[f"{arch}.expert_shared_feed_forward_length"] = int(c.get("shared_expert_intermediate_size", 0))
            meta[f"{arch}.expert_weights_norm"] = bool(c.get("norm_topk_prob", True))
        if nextn:
            meta[f"{arch}.nextn_predict_layers"] = nextn
        unused = sorted(set(self.sd) - self.used - ({"lm_head.weight"} if tied else set()))
        if unused:
            raise ConversionError(f"{len(unused)} checkpoint tensors were not mapped, e.g. {unused[:3]}")
        return arch, meta, self.out


def convert_state_dict(config: Any, state_dict: Mapping[str, torch.Tensor]) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    """(GGUF architecture, metadata with full key names, tensors in numpy order, float32)."""
    return _Converter(_text_config(config), state_dict).run()


def _read_state_dict(src: Path) -> dict[str, torch.Tensor]:
    files = sorted(src.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            state.update(load_file(str(f)))
        return state
    bins = sorted(src.glob("pytorch_model*.bin"))
    if not bins:
        raise ConversionError(f"{src}: no *.safetensors or pytorch_model*.bin files")
    for f in bins:
        state.update(torch.load(str(f), map_location="cpu", weights_only=True))
    return state


def convert_hf_dir(src_dir: str | Path, out_path: str | Path, *, outtype: str = "f32") -> tuple[str, int]:
    """Convert a Hugging Face model directory; returns (architecture, tensors written)."""
    from gguf import GGMLQuantizationType

    from tsspec_gguf.gguf_writer import write_gguf

    src = Path(src_dir)
    config_file = src / "config.json"
    if not config_file.is_file():
        raise ConversionError(f"{src}: no config.json")
    config = json.loads(config_file.read_text())
    arch, meta, tensors = convert_state_dict(config, _read_state_dict(src))
    if outtype == "f16":
        # 2-D weights in F16 (llama.cpp keeps norms and 1-D parameters in F32)
        tensors = {k: (v, GGMLQuantizationType.F16) if v.ndim >= 2 else v for k, v in tensors.items()}
    elif outtype == "q8_0":
        # matrices whose rows split into 32-value blocks in Q8_0; the rest stays F32
        q8 = GGMLQuantizationType.Q8_0
        tensors = {k: (v, q8) if v.ndim == 2 and v.shape[-1] % 32 == 0 else v for k, v in tensors.items()}
    elif outtype != "f32":
        raise ConversionError(f"--outtype {outtype!r}: use f32, f16 or q8_0")
    write_gguf(out_path, arch, meta, tensors)
    return arch, len(tensors)
