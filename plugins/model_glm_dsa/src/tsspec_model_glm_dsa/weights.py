"""Reading GLM 5.x weights out of a GGUF (or a ``MemorySource``) by llama.cpp's ``glm-dsa``
tensor names; every tensor is checked against the shape the hyperparameters imply.

Per layer ``blk.N.``: ``attn_norm``, ``ffn_norm``; MLA ``attn_q_a``, ``attn_q_a_norm``,
``attn_q_b``, ``attn_kv_a_mqa``, ``attn_kv_a_norm``, ``attn_k_b`` ([heads, kv_lora, nope]: the
key up-projection, transposed for absorption), ``attn_v_b`` ([heads, v, kv_lora]),
``attn_output``; full indexer layers ``indexer.{attn_q_b,attn_k,k_norm,proj}``; dense layers
``ffn_{gate,up,down}``; MoE layers ``ffn_gate_inp``, ``exp_probs_b``, ``ffn_{gate,up,down}_exps``,
``ffn_{gate,up,down}_shexp``. Model: ``token_embd``, ``output``, ``output_norm``. The NextN
layer ``blk.L.`` (L = trunk layers) is a decoder layer plus ``nextn.{eh_proj,enorm,hnorm}`` and
the optional ``nextn.{shared_head_norm,shared_head_head,embed_tokens}``.

``load_trunk`` never reads a ``blk.L.`` tensor; ``load_nextn`` reads only those.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from tsspec.errors import ModelLoadError

from .hparams import GlmDsaHParams


@attrs.define
class IndexerWeights:
    q_b: torch.Tensor  # [ih * id, q_lora]
    k: torch.Tensor  # [id, H]
    k_norm: torch.Tensor  # [id]
    k_norm_bias: torch.Tensor | None  # [id]
    proj: torch.Tensor  # [ih, H]


@attrs.define
class AttentionWeights:
    q_a: torch.Tensor  # [q_lora, H]
    q_a_norm: torch.Tensor  # [q_lora]
    q_b: torch.Tensor  # [heads * (nope + rope), q_lora]
    kv_a: torch.Tensor  # [kv_lora + rope, H]
    kv_a_norm: torch.Tensor  # [kv_lora]
    k_b: torch.Tensor  # [heads, kv_lora, nope]
    v_b: torch.Tensor  # [heads, v, kv_lora]
    out: torch.Tensor  # [H, heads * v]
    indexer: IndexerWeights | None = None  # None: a shared layer (or the NextN layer)


@attrs.define
class FfnWeights:
    gate: torch.Tensor  # dense [F, H] / shared expert [Fs, H]
    up: torch.Tensor
    down: torch.Tensor  # [H, F]
    router: torch.Tensor | None = None  # [E, H] (MoE layers)
    bias: torch.Tensor | None = None  # [E] selection bias
    gate_exps: torch.Tensor | None = None  # [E, Fe, H]
    up_exps: torch.Tensor | None = None
    down_exps: torch.Tensor | None = None  # [E, H, Fe]


@attrs.define
class LayerWeights:
    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    attn: AttentionWeights
    ffn: FfnWeights


@attrs.define
class NextNWeights:
    eh_proj: torch.Tensor  # [H, 2H]
    enorm: torch.Tensor
    hnorm: torch.Tensor
    head_norm: torch.Tensor  # shared_head_norm, else the trunk's output_norm
    head: torch.Tensor | None  # shared_head_head [V, H], else None (the trunk's LM head)
    embed: torch.Tensor | None  # embed_tokens [V, H], else None (the trunk's embedding)
    layer: LayerWeights


@attrs.define
class GlmDsaWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # [V, H]


def nextn_tensor_names(source: Any, hp: GlmDsaHParams) -> list[str]:
    """The file's tensors of the NextN layers (``blk.L.*`` for L >= trunk layers)."""
    prefixes = tuple(f"blk.{hp.num_layers + i}." for i in range(hp.nextn_layers))
    return [n for n in source.tensor_names if prefixes and n.startswith(prefixes)]


class Reader:
    def __init__(self, source: Any, hp: GlmDsaHParams, dtype: torch.dtype):
        self.source, self.hp, self.dtype = source, hp, dtype
        self.path = getattr(source, "path", "<memory>")

    def has(self, name: str) -> bool:
        return self.source.has_tensor(name)

    def get(self, name: str, *shape: int) -> torch.Tensor:
        if not self.has(name):
            raise ModelLoadError(self.path, f"missing tensor {name!r}")
        actual = tuple(int(s) for s in self.source.tensor_shape(name))
        if shape and actual != tuple(shape) and _numel(actual) != _numel(shape):
            raise ModelLoadError(self.path, f"tensor {name!r} has shape {list(actual)}, expected {list(shape)}")
        out = self.source.tensor(name, self.dtype)
        return out.reshape(shape).contiguous() if shape else out

    def attention(self, p: str, indexed: bool) -> AttentionWeights:
        hp, H = self.hp, self.hp.hidden_size
        nh, qr, kr = hp.num_heads, hp.q_lora_rank, hp.kv_lora_rank
        w = AttentionWeights(
            q_a=self.get(f"{p}.attn_q_a.weight", qr, H), q_a_norm=self.get(f"{p}.attn_q_a_norm.weight", qr),
            q_b=self.get(f"{p}.attn_q_b.weight", nh * hp.qk_head_dim, qr),
            kv_a=self.get(f"{p}.attn_kv_a_mqa.weight", kr + hp.rope_dims, H),
            kv_a_norm=self.get(f"{p}.attn_kv_a_norm.weight", kr),
            k_b=self.get(f"{p}.attn_k_b.weight", nh, kr, hp.qk_nope_dim),
            v_b=self.get(f"{p}.attn_v_b.weight", nh, hp.v_head_dim, kr),
            out=self.get(f"{p}.attn_output.weight", H, nh * hp.v_head_dim),
        )
        if indexed:
            ih, idim = hp.index_heads, hp.index_head_dim
            w.indexer = IndexerWeights(
                q_b=self.get(f"{p}.indexer.attn_q_b.weight", ih * idim, qr), k=self.get(f"{p}.indexer.attn_k.weight", idim, H),
                k_norm=self.get(f"{p}.indexer.k_norm.weight", idim),
                k_norm_bias=self.get(f"{p}.indexer.k_norm.bias", idim) if self.has(f"{p}.indexer.k_norm.bias") else None,
                proj=self.get(f"{p}.indexer.proj.weight", ih, H),
            )
        return w

    def ffn(self, p: str, moe: bool) -> FfnWeights:
        hp, H = self.hp, self.hp.hidden_size
        if not moe:
            F = hp.ffn_size
            return FfnWeights(gate=self.get(f"{p}.ffn_gate.weight", F, H), up=self.get(f"{p}.ffn_up.weight", F, H),
                              down=self.get(f"{p}.ffn_down.weight", H, F))
        E, Fe = hp.num_experts, hp.expert_ffn_size
        Fs = Fe * max(hp.shared_experts, 1)
        return FfnWeights(
            gate=self.get(f"{p}.ffn_gate_shexp.weight", Fs, H), up=self.get(f"{p}.ffn_up_shexp.weight", Fs, H),
            down=self.get(f"{p}.ffn_down_shexp.weight", H, Fs), router=self.get(f"{p}.ffn_gate_inp.weight", E, H),
            bias=self.get(f"{p}.exp_probs_b.bias", E) if self.has(f"{p}.exp_probs_b.bias") else None,
            gate_exps=self.get(f"{p}.ffn_gate_exps.weight", E, Fe, H), up_exps=self.get(f"{p}.ffn_up_exps.weight", E, Fe, H),
            down_exps=self.get(f"{p}.ffn_down_exps.weight", E, H, Fe),
        )

    def layer(self, index: int, *, indexed: bool, moe: bool) -> LayerWeights:
        p, H = f"blk.{index}", self.hp.hidden_size
        return LayerWeights(attn_norm=self.get(f"{p}.attn_norm.weight", H), ffn_norm=self.get(f"{p}.ffn_norm.weight", H),
                            attn=self.attention(p, indexed), ffn=self.ffn(p, moe))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def load_trunk(source: Any, hp: GlmDsaHParams, dtype: torch.dtype = torch.float32) -> GlmDsaWeights:
    r = Reader(source, hp, dtype)
    H, V = hp.hidden_size, hp.vocab_size
    embed = r.get("token_embd.weight", V, H)
    layers = [r.layer(i, indexed=hp.indexer_full[i], moe=i >= hp.dense_layers) for i in range(hp.num_layers)]
    return GlmDsaWeights(embed=embed, layers=layers, final_norm=r.get("output_norm.weight", H),
                         lm_head=r.get("output.weight", V, H) if r.has("output.weight") else embed)


def has_nextn(source: Any, hp: GlmDsaHParams) -> bool:
    return hp.nextn_layers > 0 and source.has_tensor(f"blk.{hp.num_layers}.nextn.eh_proj.weight")


def load_nextn(source: Any, hp: GlmDsaHParams, final_norm: torch.Tensor,
               dtype: torch.dtype = torch.float32) -> NextNWeights:
    """The first NextN layer (``blk.L.``); its attention is dense (no indexer), as llama.cpp runs it."""
    r = Reader(source, hp, dtype)
    L, H, V = hp.num_layers, hp.hidden_size, hp.vocab_size
    p = f"blk.{L}.nextn"
    return NextNWeights(
        eh_proj=r.get(f"{p}.eh_proj.weight", H, 2 * H), enorm=r.get(f"{p}.enorm.weight", H),
        hnorm=r.get(f"{p}.hnorm.weight", H),
        head_norm=r.get(f"{p}.shared_head_norm.weight", H) if r.has(f"{p}.shared_head_norm.weight") else final_norm,
        head=r.get(f"{p}.shared_head_head.weight", V, H) if r.has(f"{p}.shared_head_head.weight") else None,
        embed=r.get(f"{p}.embed_tokens.weight", V, H) if r.has(f"{p}.embed_tokens.weight") else None,
        layer=r.layer(L, indexed=False, moe=r.has(f"blk.{L}.ffn_gate_inp.weight")),
    )
