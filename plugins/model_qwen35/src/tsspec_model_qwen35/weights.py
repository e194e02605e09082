"""Reading trunk and NextN weights out of a GGUF (or a ``MemorySource``) by llama.cpp's names.

Every tensor is checked against the shape the hyperparameters imply, so a wrong file fails at
load with the tensor's name instead of a matmul error mid-generation. Accepted layouts:

* GDN input: ``attn_qkv`` + ``attn_gate`` (current files) or the legacy qwen3next ``ssm_in``
  (q|k|v|z grouped per key head), split here into the same all-Q | all-K | all-V + z layout.
* GDN gates: ``ssm_beta`` + ``ssm_alpha`` (qwen35*) or ``ssm_ba`` grouped per key head
  ``[b_g(r) ; a_g(r)]`` (qwen3next).
* Experts: ``ffn_{gate,up}_exps`` or the fused ``ffn_gate_up_exps`` (gate half first). A layer
  without ``ffn_gate_inp`` is dense, whatever the architecture.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from tsspec.errors import ModelLoadError

from .attention import AttentionWeights
from .deltanet import DeltaNetWeights
from .ffn import DenseFFN, MoEFFN
from .hparams import Qwen35HParams


@attrs.define
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    post_norm: torch.Tensor  # [H] the pre-FFN norm (GGUF post_attention_norm)
    mixer: AttentionWeights | DeltaNetWeights
    ffn: DenseFFN | MoEFFN


@attrs.define
class NextNWeights:
    eh_proj: torch.Tensor  # [H, 2H] over [enorm(emb) ; hnorm(h)]
    enorm: torch.Tensor  # [H]
    hnorm: torch.Tensor  # [H]
    head_norm: torch.Tensor  # [H] shared_head_norm (falls back to output_norm)
    embed: torch.Tensor  # [V, H] (nextn.embed_tokens, else the trunk's)
    lm_head: torch.Tensor  # [V, H] (nextn.shared_head_head, else the trunk's)
    layer: LayerWeights  # one full-attention decoder layer


@attrs.define
class Qwen35Weights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H] (token_embd when the file has no output.weight)
    nextn: NextNWeights | None = None


class _Reader:
    def __init__(self, source: Any, hp: Qwen35HParams, dtype: torch.dtype):
        self.source, self.hp, self.dtype = source, hp, dtype
        self.path = getattr(source, "path", "<memory>")

    def has(self, name: str) -> bool:
        return self.source.has_tensor(name)

    def get(self, name: str, *shape: int) -> torch.Tensor:
        """The tensor, reshaped to ``shape`` when its element count matches (norm vectors are
        sometimes stored [1, n]); a clear error otherwise."""
        if not self.has(name):
            raise ModelLoadError(self.path, f"missing tensor {name!r}")
        actual = tuple(self.source.tensor_shape(name))
        if shape and tuple(actual) != tuple(shape):
            n_actual, n_wanted = 1, 1
            for s in actual:
                n_actual *= s
            for s in shape:
                n_wanted *= s
            if n_actual != n_wanted:
                raise ModelLoadError(self.path, f"tensor {name!r} has shape {list(actual)}, expected {list(shape)}")
        out = self.source.tensor(name, self.dtype)
        return out.reshape(shape).contiguous() if shape else out

    # -- blocks --------------------------------------------------------------------------
    def attention(self, p: str) -> AttentionWeights:
        hp, H = self.hp, self.hp.hidden_size
        q_dim, kv_dim = hp.num_heads * 2 * hp.head_dim, hp.num_kv_heads * hp.head_dim
        if self.has(f"{p}.attn_q.weight"):
            q, k, v = (self.get(f"{p}.attn_q.weight", q_dim, H), self.get(f"{p}.attn_k.weight", kv_dim, H),
                       self.get(f"{p}.attn_v.weight", kv_dim, H))
        else:  # fused q_full | k | v
            q, k, v = self.get(f"{p}.attn_qkv.weight", q_dim + 2 * kv_dim, H).split([q_dim, kv_dim, kv_dim])
        return AttentionWeights(
            q=q.contiguous(), k=k.contiguous(), v=v.contiguous(),
            o=self.get(f"{p}.attn_output.weight", H, hp.num_heads * hp.head_dim),
            q_norm=self.get(f"{p}.attn_q_norm.weight", hp.head_dim),
            k_norm=self.get(f"{p}.attn_k_norm.weight", hp.head_dim),
        )

    def deltanet(self, p: str) -> DeltaNetWeights:
        hp, H = self.hp, self.hp.hidden_size
        nk, nv, dk, dv, r = hp.num_k_heads, hp.num_v_heads, hp.k_head_dim, hp.v_head_dim, hp.v_per_k
        if self.has(f"{p}.attn_qkv.weight"):
            qkv = self.get(f"{p}.attn_qkv.weight", hp.conv_dim, H)
            z = self.get(f"{p}.attn_gate.weight", hp.value_dim, H)
        elif self.has(f"{p}.ssm_in.weight"):  # legacy qwen3next: grouped per key head
            grouped = self.get(f"{p}.ssm_in.weight", 2 * hp.key_dim + 2 * hp.value_dim, H)
            grouped = grouped.view(nk, 2 * dk + 2 * r * dv, H)
            qg, kg, vg, zg = grouped.split([dk, dk, r * dv, r * dv], dim=1)
            qkv = torch.cat([qg.reshape(-1, H), kg.reshape(-1, H), vg.reshape(-1, H)])
            z = zg.reshape(-1, H)
        else:
            raise ModelLoadError(self.path, f"missing tensor {p + '.attn_qkv.weight'!r} (or legacy ssm_in)")
        if self.has(f"{p}.ssm_beta.weight"):
            beta = self.get(f"{p}.ssm_beta.weight", nv, H)
            alpha = self.get(f"{p}.ssm_alpha.weight", nv, H)
        else:
            ba = self.get(f"{p}.ssm_ba.weight", 2 * nv, H).view(nk, 2, r, H)
            beta, alpha = ba[:, 0].reshape(nv, H), ba[:, 1].reshape(nv, H)
        key_index = torch.tensor(hp.key_head_of_value_head(), dtype=torch.long)
        return DeltaNetWeights(
            in_proj=torch.cat([qkv, z, beta, alpha]).contiguous(),
            conv=self.get(f"{p}.ssm_conv1d.weight", hp.conv_dim, hp.conv_kernel),
            dt_bias=self.get(f"{p}.ssm_dt.bias", nv),
            a=self.get(f"{p}.ssm_a", nv),
            norm=self.get(f"{p}.ssm_norm.weight", dv),
            out=self.get(f"{p}.ssm_out.weight", H, hp.value_dim),
            key_index=key_index,
        )

    def ffn(self, p: str) -> DenseFFN | MoEFFN:
        hp, H = self.hp, self.hp.hidden_size
        if not self.has(f"{p}.ffn_gate_inp.weight"):  # dense (qwen35, or a qwen3next mlp_only layer)
            F = self.source.tensor_shape(f"{p}.ffn_gate.weight")[0] if self.has(f"{p}.ffn_gate.weight") else hp.ffn_size
            return DenseFFN(self.get(f"{p}.ffn_gate.weight", F, H), self.get(f"{p}.ffn_up.weight", F, H),
                            self.get(f"{p}.ffn_down.weight", H, F))
        E = hp.num_experts
        down = self.get(f"{p}.ffn_down_exps.weight")
        F = int(down.shape[-1])
        down = down.reshape(E, H, F)
        if self.has(f"{p}.ffn_gate_exps.weight"):
            gate, up = self.get(f"{p}.ffn_gate_exps.weight", E, F, H), self.get(f"{p}.ffn_up_exps.weight", E, F, H)
        else:
            gate, up = self.get(f"{p}.ffn_gate_up_exps.weight", E, 2 * F, H).split([F, F], dim=1)
        shared, shared_gate = None, None
        if self.has(f"{p}.ffn_up_shexp.weight"):
            Fs = self.source.tensor_shape(f"{p}.ffn_up_shexp.weight")[0]
            shared = DenseFFN(self.get(f"{p}.ffn_gate_shexp.weight", Fs, H), self.get(f"{p}.ffn_up_shexp.weight", Fs, H),
                              self.get(f"{p}.ffn_down_shexp.weight", H, Fs))
            shared_gate = self.get(f"{p}.ffn_gate_inp_shexp.weight", H)
        return MoEFFN(
            router=self.get(f"{p}.ffn_gate_inp.weight", E, H), gate_exps=gate.contiguous(), up_exps=up.contiguous(),
            down_exps=down.contiguous(), top_k=hp.experts_per_token, norm_top_k=hp.norm_top_k,
            shared=shared, shared_gate=shared_gate,
        )

    def layer(self, index: int, recurrent: bool) -> LayerWeights:
        p, H = f"blk.{index}", self.hp.hidden_size
        return LayerWeights(
            attn_norm=self.get(f"{p}.attn_norm.weight", H),
            post_norm=self.get(f"{p}.post_attention_norm.weight", H),
            mixer=self.deltanet(p) if recurrent else self.attention(p),
            ffn=self.ffn(p),
        )


def move_weights(obj: Any, device: torch.device | str) -> Any:
    """The same weights structure with every tensor on ``device`` (attrs classes, lists, tuples)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if attrs.has(type(obj)):
        return attrs.evolve(obj, **{f.name: move_weights(getattr(obj, f.name), device)
                                    for f in attrs.fields(type(obj)) if f.init})
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_weights(item, device) for item in obj)
    return obj


def load_weights(source: Any, hp: Qwen35HParams, dtype: torch.dtype = torch.float32, *,
                 with_nextn: bool = True) -> Qwen35Weights:
    """All trunk weights (and the first NextN block when present and asked for)."""
    r = _Reader(source, hp, dtype)
    H, V = hp.hidden_size, hp.vocab_size
    embed = r.get("token_embd.weight", V, H)
    lm_head = r.get("output.weight", V, H) if r.has("output.weight") else embed
    final_norm = r.get("output_norm.weight", H)
    layers = [r.layer(i, rec) for i, rec in enumerate(hp.recurrent)]
    nextn = None
    L = hp.num_layers
    if with_nextn and hp.nextn_layers > 0 and r.has(f"blk.{L}.nextn.eh_proj.weight"):
        p = f"blk.{L}.nextn"
        nextn = NextNWeights(
            eh_proj=r.get(f"{p}.eh_proj.weight", H, 2 * H),
            enorm=r.get(f"{p}.enorm.weight", H),
            hnorm=r.get(f"{p}.hnorm.weight", H),
            head_norm=r.get(f"{p}.shared_head_norm.weight", H) if r.has(f"{p}.shared_head_norm.weight") else final_norm,
            embed=r.get(f"{p}.embed_tokens.weight", V, H) if r.has(f"{p}.embed_tokens.weight") else embed,
            lm_head=r.get(f"{p}.shared_head_head.weight", V, H) if r.has(f"{p}.shared_head_head.weight") else lm_head,
            layer=r.layer(L, recurrent=False),
        )
    return Qwen35Weights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head, nextn=nextn)
