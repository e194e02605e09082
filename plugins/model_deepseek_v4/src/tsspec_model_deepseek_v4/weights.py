"""Reading DeepSeek V4 weights out of a GGUF (or a ``MemorySource``) by llama.cpp's ``deepseek4``
tensor names. Every tensor is checked against the shape the hyperparameters imply.

Per layer ``blk.N.``: ``attn_norm``, ``ffn_norm``; attention ``attn_q_a``, ``attn_q_a_norm``,
``attn_q_b``, ``attn_kv``, ``attn_kv_a_norm``, ``attn_output_a``, ``attn_output_b``,
``attn_sinks``; compressed layers ``attn_compressor_{kv,gate,ape,norm}``; indexed layers
``indexer_compressor_{kv,gate,ape,norm}``, ``indexer.attn_q_b``, ``indexer.proj``;
hyper-connections ``hc_{attn,ffn}_{fn,base,scale}``; MoE ``ffn_gate_inp``, ``exp_probs_b``
(learned layers) or ``ffn_gate_tid2eid`` (hash layers), ``ffn_{gate,up,down}_exps``,
``ffn_{gate,up,down}_shexp``. Model: ``token_embd``, ``output``, ``output_norm``,
``output_hc_{fn,base,scale}``. The MTP block ``blk.L.`` (L = trunk layers) adds
``nextn.{e_proj,h_proj,enorm,hnorm,shared_head_norm,hc_head_fn,hc_head_base,hc_head_scale}``.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from tsspec.errors import ModelLoadError

from .attention import AttentionWeights, CompressorWeights, IndexerWeights
from .hparams import DeepseekV4HParams
from .moe import MoEWeights


@attrs.define
class HyperWeights:
    fn: torch.Tensor  # [(2 + hc) * hc, hc * H] (the head's: [hc, hc * H])
    base: torch.Tensor
    scale: torch.Tensor


@attrs.define
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    ffn_norm: torch.Tensor  # [H]
    attn: AttentionWeights
    moe: MoEWeights
    hc_attn: HyperWeights
    hc_ffn: HyperWeights


@attrs.define
class MtpWeights:
    e_proj: torch.Tensor  # [H, H]
    h_proj: torch.Tensor  # [H, H]
    enorm: torch.Tensor
    hnorm: torch.Tensor
    norm: torch.Tensor  # the head's final norm
    hc_head: HyperWeights
    layer: LayerWeights


@attrs.define
class DeepseekV4Weights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # [V, H]
    hc_head: HyperWeights
    mtp: MtpWeights | None = None


class Reader:
    def __init__(self, source: Any, hp: DeepseekV4HParams, dtype: torch.dtype):
        self.source, self.hp, self.dtype = source, hp, dtype
        self.path = getattr(source, "path", "<memory>")

    def has(self, name: str) -> bool:
        return self.source.has_tensor(name)

    def get(self, name: str, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        if not self.has(name):
            raise ModelLoadError(self.path, f"missing tensor {name!r}")
        actual = tuple(int(s) for s in self.source.tensor_shape(name))
        if shape and actual != tuple(shape):
            if _numel(actual) != _numel(shape):
                raise ModelLoadError(self.path, f"tensor {name!r} has shape {list(actual)}, expected {list(shape)}")
        out = self.source.tensor(name, dtype or self.dtype)
        return out.reshape(shape).contiguous() if shape else out

    def hyper(self, prefix: str, rows: int, scales: int) -> HyperWeights:
        hp = self.hp
        return HyperWeights(
            fn=self.get(f"{prefix}_fn.weight", rows, hp.hc_mult * hp.hidden_size),
            base=self.get(f"{prefix}_base.weight", rows),
            scale=self.get(f"{prefix}_scale.weight", scales),
        )

    def compressor(self, p: str, dim: int, ratio: int) -> CompressorWeights:
        H = self.hp.hidden_size
        rows = int(self.source.tensor_shape(f"{p}_kv.weight")[0]) if self.has(f"{p}_kv.weight") else dim
        if rows not in (dim, 2 * dim):
            raise ModelLoadError(self.path, f"tensor {p + '_kv.weight'!r} has {rows} rows; expected {dim} or {2 * dim}")
        return CompressorWeights(
            kv=self.get(f"{p}_kv.weight", rows, H), gate=self.get(f"{p}_gate.weight", rows, H),
            ape=self.get(f"{p}_ape.weight", ratio, rows), norm=self.get(f"{p}_norm.weight", dim), ratio=ratio,
        )

    def attention(self, p: str, ratio: int, indexed: bool) -> AttentionWeights:
        hp, H = self.hp, self.hp.hidden_size
        nh, hd, qr = hp.num_heads, hp.head_dim, hp.q_lora_rank
        w = AttentionWeights(
            q_a=self.get(f"{p}.attn_q_a.weight", qr, H), q_a_norm=self.get(f"{p}.attn_q_a_norm.weight", qr),
            q_b=self.get(f"{p}.attn_q_b.weight", nh * hd, qr), kv=self.get(f"{p}.attn_kv.weight", hd, H),
            kv_norm=self.get(f"{p}.attn_kv_a_norm.weight", hd),
            o_a=self.get(f"{p}.attn_output_a.weight", hp.o_groups * hp.o_lora_rank, nh * hd // hp.o_groups),
            o_b=self.get(f"{p}.attn_output_b.weight", H, hp.o_groups * hp.o_lora_rank),
            sinks=self.get(f"{p}.attn_sinks.weight", nh),
        )
        if ratio > 0:
            w.compressor = self.compressor(f"{p}.attn_compressor", hd, ratio)
        if ratio > 0 and indexed:
            ihd, ih = hp.index_head_dim, hp.index_heads
            w.indexer = IndexerWeights(
                compressor=self.compressor(f"{p}.indexer_compressor", ihd, ratio),
                q_b=self.get(f"{p}.indexer.attn_q_b.weight", ih * ihd, qr),
                proj=self.get(f"{p}.indexer.proj.weight", ih, H), heads=ih, topk=hp.index_topk,
            )
        return w

    def moe(self, p: str, hashed: bool) -> MoEWeights:
        hp, H = self.hp, self.hp.hidden_size
        E, F, Fs = hp.num_experts, hp.expert_ffn_size, hp.shared_ffn_size
        w = MoEWeights(
            router=self.get(f"{p}.ffn_gate_inp.weight", E, H),
            gate_exps=self.get(f"{p}.ffn_gate_exps.weight", E, F, H), up_exps=self.get(f"{p}.ffn_up_exps.weight", E, F, H),
            down_exps=self.get(f"{p}.ffn_down_exps.weight", E, H, F),
            shared_gate=self.get(f"{p}.ffn_gate_shexp.weight", Fs, H), shared_up=self.get(f"{p}.ffn_up_shexp.weight", Fs, H),
            shared_down=self.get(f"{p}.ffn_down_shexp.weight", H, Fs),
        )
        if hashed:
            table = self.get(f"{p}.ffn_gate_tid2eid.weight", hp.vocab_size, hp.experts_per_token, dtype=torch.float64)
            w.tid2eid = table.round().to(torch.long)
            if int(w.tid2eid.min()) < 0 or int(w.tid2eid.max()) >= E:
                raise ModelLoadError(self.path, f"{p}.ffn_gate_tid2eid names an expert outside 0..{E - 1}")
        elif self.has(f"{p}.exp_probs_b.bias"):
            w.bias = self.get(f"{p}.exp_probs_b.bias", E)
        return w

    def layer(self, index: int, ratio: int, indexed: bool, hashed: bool) -> LayerWeights:
        p, hp = f"blk.{index}", self.hp
        hc_rows = (2 + hp.hc_mult) * hp.hc_mult
        return LayerWeights(
            attn_norm=self.get(f"{p}.attn_norm.weight", hp.hidden_size),
            ffn_norm=self.get(f"{p}.ffn_norm.weight", hp.hidden_size),
            attn=self.attention(p, ratio, indexed), moe=self.moe(p, hashed),
            hc_attn=self.hyper(f"{p}.hc_attn", hc_rows, 3), hc_ffn=self.hyper(f"{p}.hc_ffn", hc_rows, 3),
        )


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def load_weights(source: Any, hp: DeepseekV4HParams, dtype: torch.dtype = torch.float32, *,
                 with_mtp: bool = True) -> DeepseekV4Weights:
    r = Reader(source, hp, dtype)
    H, V, hc = hp.hidden_size, hp.vocab_size, hp.hc_mult
    embed = r.get("token_embd.weight", V, H)
    layers = [r.layer(i, hp.compress_ratios[i], hp.indexed[i], i < hp.hash_layers) for i in range(hp.num_layers)]
    weights = DeepseekV4Weights(
        embed=embed, layers=layers, final_norm=r.get("output_norm.weight", H),
        lm_head=r.get("output.weight", V, H) if r.has("output.weight") else embed,
        hc_head=r.hyper("output_hc", hc, 1),
    )
    L = hp.num_layers
    if with_mtp and hp.nextn_layers > 0 and r.has(f"blk.{L}.nextn.e_proj.weight"):
        p = f"blk.{L}.nextn"
        if hp.mtp_compress_ratio:
            raise ModelLoadError(r.path, f"the MTP block has compress ratio {hp.mtp_compress_ratio}; "
                                         "only a sliding-window MTP block (ratio 0) is supported")
        weights.mtp = MtpWeights(
            e_proj=r.get(f"{p}.e_proj.weight", H, H), h_proj=r.get(f"{p}.h_proj.weight", H, H),
            enorm=r.get(f"{p}.enorm.weight", H), hnorm=r.get(f"{p}.hnorm.weight", H),
            norm=r.get(f"{p}.shared_head_norm.weight", H), hc_head=r.hyper(f"{p}.hc_head", hc, 1),
            layer=r.layer(L, 0, False, False),
        )
    return weights
