"""Hyperparameters of a GLM 5.x trunk, read from GGUF metadata (``general.architecture =
glm-dsa``; llama.cpp's key names, as its ``GlmMoeDsaModel`` converter writes them).

``block_count`` counts the NextN layers stored after the trunk (``nextn_predict_layers``); the
first ``leading_dense_block_count`` layers have a dense MLP, the rest MoE with shared experts.
``attention.indexer.types`` marks per trunk layer whether it runs its own lightning indexer
(true, "full") or reuses the top-k of the previous full layer (false, "shared"). A file without
it follows llama.cpp: every layer full for GLM 5 / 5.1 (trained context under 2^20), GLM 5.2's
published pattern otherwise (layers 0, 1 and every fourth from 2 full).
"""

from __future__ import annotations

from typing import Any

import attrs

from tsspec.errors import ModelLoadError

ARCHITECTURE = "glm-dsa"
GATING = {1: "softmax", 2: "sigmoid"}  # expert_gating_func
DEFAULT_CONTEXT = 4096
GLM_5_2_CONTEXT = 1 << 20  # files without indexer types: from this trained context on, GLM 5.2's pattern


@attrs.frozen
class GlmDsaHParams:
    """Everything the trunk, the NextN head and the loader need (no metadata keys past here)."""

    vocab_size: int
    hidden_size: int
    num_layers: int  # trunk layers (block_count minus the NextN layers)
    context_length: int
    rms_eps: float
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    rope_dims: int
    v_head_dim: int
    rope_base: float
    index_heads: int
    index_head_dim: int
    index_topk: int
    indexer_full: tuple[bool, ...]  # per trunk layer
    dense_layers: int  # leading layers with a dense MLP
    ffn_size: int  # the dense MLP
    num_experts: int
    experts_per_token: int
    expert_ffn_size: int
    shared_experts: int
    routed_scale: float
    norm_topk: bool
    gating: str
    expert_groups: int
    groups_used: int
    nextn_layers: int = 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_dim + self.rope_dims

    def check(self, path: object = "<memory>") -> None:
        problems = []
        if self.rope_dims % 2 or not 0 < self.rope_dims <= self.index_head_dim:
            problems.append(f"rope dimension count {self.rope_dims} must be even and fit the indexer head "
                            f"({self.index_head_dim})")
        if self.num_layers > self.dense_layers and not 0 < self.experts_per_token <= self.num_experts:
            problems.append(f"{self.experts_per_token} experts per token out of {self.num_experts}")
        if self.gating not in GATING.values():
            problems.append(f"expert gating function {self.gating!r} is not one of {', '.join(GATING.values())}")
        if self.num_experts and (self.expert_groups < 1 or self.num_experts % self.expert_groups
                                 or not 0 < self.groups_used <= self.expert_groups):
            problems.append(f"{self.num_experts} experts do not split into {self.expert_groups} groups "
                            f"of which {self.groups_used} are used")
        if len(self.indexer_full) != self.num_layers:
            problems.append(f"attention.indexer.types has {len(self.indexer_full)} entries for {self.num_layers} layers")
        elif self.indexer_full and not self.indexer_full[0]:
            problems.append("layer 0 is a shared indexer layer: it has no full layer before it to share")
        if self.index_heads < 1 or self.index_topk < 1:
            problems.append("attention.indexer.{head_count,top_k} must be >= 1")
        if problems:
            raise ModelLoadError(path, "; ".join(problems))

    @classmethod
    def from_gguf(cls, source: Any) -> "GlmDsaHParams":
        path = getattr(source, "path", "<memory>")
        if source.architecture != ARCHITECTURE:
            raise ModelLoadError(path, f"architecture {source.architecture!r} is not {ARCHITECTURE!r}")

        def key(suffix: str, default: Any = ...) -> Any:
            name = source.arch_key(suffix)
            return source.get(name) if default is ... else source.get(name, default)

        scaling = str(key("rope.scaling.type", "none") or "none").lower()
        if scaling not in ("none", "linear") or float(key("rope.scaling.factor", 1.0) or 1.0) != 1.0:
            raise ModelLoadError(path, f"RoPE scaling {scaling!r} is not supported by tsspec-model-glm-dsa "
                                       "(plain RoPE only)")
        nextn = int(key("nextn_predict_layers", 0) or 0)
        block_count = int(key("block_count"))
        num_layers = block_count - nextn
        if num_layers < 1:
            raise ModelLoadError(path, f"block_count {block_count} leaves no trunk layers after {nextn} NextN layers")
        if not source.has_tensor("token_embd.weight"):
            raise ModelLoadError(path, "missing tensor 'token_embd.weight'")
        types = key("attention.indexer.types", None)
        context = int(key("context_length", DEFAULT_CONTEXT))
        if types is not None:
            full = tuple(bool(int(t)) for t in list(types)[:num_layers])
        elif context < GLM_5_2_CONTEXT:
            full = (True,) * num_layers
        else:
            full = tuple(i < 2 or (i - 2) % 4 == 0 for i in range(num_layers))
        rope = int(key("rope.dimension_count"))
        gating = key("expert_gating_func", 2)
        hp = cls(
            vocab_size=int(source.tensor_shape("token_embd.weight")[0]),
            hidden_size=int(key("embedding_length")),
            num_layers=num_layers,
            context_length=context,
            rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
            num_heads=int(key("attention.head_count")),
            q_lora_rank=int(key("attention.q_lora_rank")),
            kv_lora_rank=int(key("attention.kv_lora_rank")),
            qk_nope_dim=int(key("attention.key_length_mla")) - rope,
            rope_dims=rope,
            v_head_dim=int(key("attention.value_length_mla")),
            rope_base=float(key("rope.freq_base", 10000.0)),
            index_heads=int(key("attention.indexer.head_count")),
            index_head_dim=int(key("attention.indexer.key_length")),
            index_topk=int(key("attention.indexer.top_k")),
            indexer_full=full,
            dense_layers=min(int(key("leading_dense_block_count", 0) or 0), num_layers),
            ffn_size=int(key("feed_forward_length", 0) or 0),
            num_experts=int(key("expert_count", 0) or 0),
            experts_per_token=int(key("expert_used_count", 0) or 0),
            expert_ffn_size=int(key("expert_feed_forward_length", 0) or 0),
            shared_experts=int(key("expert_shared_count", 0) or 0),
            routed_scale=float(key("expert_weights_scale", 1.0) or 1.0),
            norm_topk=bool(key("expert_weights_norm", False)),
            gating=GATING.get(int(gating), f"#{gating}"),
            expert_groups=int(key("expert_group_count", 1) or 1),
            groups_used=int(key("expert_group_used_count", 1) or 1),
            nextn_layers=nextn,
        )
        hp.check(path)
        return hp
