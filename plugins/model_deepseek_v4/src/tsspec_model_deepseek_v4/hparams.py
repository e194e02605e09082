"""Hyperparameters of a DeepSeek V4 trunk, read from GGUF metadata (``general.architecture =
deepseek4``; llama.cpp's key names).

Layer types come from the per-layer ``attention.compress_ratios`` array: 0 is a sliding-window
layer, any other ratio m a compressed layer; the ratio that carries a lightning indexer (the
CSA ratio, 4 on V4 Flash) is the smallest non-zero ratio unless ``attention.indexer.types``
names them. A layer is hash-routed when its index is below ``hash_layer_count``.
``block_count`` counts the MTP / DSpark blocks stored after the trunk (``nextn_predict_layers``).
"""

from __future__ import annotations

from typing import Any

import attrs

from tsspec.errors import ModelLoadError

ARCHITECTURE = "deepseek4"
SCORING = {0: "sqrtsoftplus", 1: "softmax", 2: "sigmoid", 4: "sqrtsoftplus"}  # expert_gating_func
SCORING_NAMES = ("sqrtsoftplus", "softmax", "sigmoid")
DEFAULT_CONTEXT = 4096


@attrs.frozen
class DeepseekV4HParams:
    """Everything the trunk, the MTP head and the loader need (no metadata keys past here)."""

    vocab_size: int
    hidden_size: int
    num_layers: int  # trunk layers (block_count minus the MTP blocks)
    context_length: int
    rms_eps: float
    # attention
    num_heads: int
    head_dim: int  # the one shared K = V head
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    rope_dims: int  # rotated tail of each head
    rope_base: float  # sliding layers
    compress_rope_base: float  # compressed layers and their compressors
    compress_yarn: dict | None  # {"factor", "original_context", "beta_fast", "beta_slow"} or None
    sliding_window: int
    compress_ratios: tuple[int, ...]  # per trunk layer (0 = sliding only)
    indexed: tuple[bool, ...]  # per trunk layer: a lightning indexer selects compressed entries
    index_heads: int
    index_head_dim: int
    index_topk: int
    # MoE
    num_experts: int
    experts_per_token: int
    expert_ffn_size: int
    shared_ffn_size: int
    routed_scale: float
    scoring: str
    hash_layers: int
    swiglu_limit: float
    # hyper-connections
    hc_mult: int
    hc_iters: int
    hc_eps: float
    nextn_layers: int = 0
    mtp_compress_ratio: int = 0

    def check(self, path: object = "<memory>") -> None:
        problems = []
        if self.num_heads * self.head_dim % max(self.o_groups, 1):
            problems.append(f"{self.num_heads} heads x {self.head_dim} do not split into {self.o_groups} output groups")
        if not 0 < self.rope_dims <= min(self.head_dim, self.index_head_dim or self.head_dim) or self.rope_dims % 2:
            problems.append(f"rope dimension count {self.rope_dims} does not fit the head dims")
        if not 0 < self.experts_per_token <= self.num_experts:
            problems.append(f"{self.experts_per_token} experts per token out of {self.num_experts}")
        if self.hc_mult < 1:
            problems.append(f"hyper_connection.count {self.hc_mult} must be >= 1")
        if self.scoring not in SCORING_NAMES:
            problems.append(f"expert gating function {self.scoring!r} is not one of {', '.join(SCORING_NAMES)}")
        if len(self.compress_ratios) != self.num_layers:
            problems.append(f"compress_ratios has {len(self.compress_ratios)} entries for {self.num_layers} layers")
        if any(r < 0 for r in self.compress_ratios):
            problems.append("negative compress ratio")
        if any(self.indexed) and (self.index_heads < 1 or self.index_head_dim < 1 or self.index_topk < 1):
            problems.append("an indexed layer needs attention.indexer.{head_count,key_length,top_k}")
        if self.sliding_window < 1:
            problems.append(f"sliding window {self.sliding_window} must be >= 1")
        if problems:
            raise ModelLoadError(path, "; ".join(problems))

    @classmethod
    def from_gguf(cls, source: Any) -> "DeepseekV4HParams":
        path = getattr(source, "path", "<memory>")
        if source.architecture != ARCHITECTURE:
            raise ModelLoadError(path, f"architecture {source.architecture!r} is not {ARCHITECTURE!r}")

        def key(suffix: str, default: Any = ...) -> Any:
            name = source.arch_key(suffix)
            return source.get(name) if default is ... else source.get(name, default)

        hidden = int(key("embedding_length"))
        nextn = int(key("nextn_predict_layers", 0) or 0)
        block_count = int(key("block_count"))
        num_layers = block_count - nextn
        if num_layers < 1:
            raise ModelLoadError(path, f"block_count {block_count} leaves no trunk layers after {nextn} MTP blocks")
        ratios_all = [int(r) for r in list(key("attention.compress_ratios", [0] * num_layers))]
        if len(ratios_all) < num_layers:
            raise ModelLoadError(path, f"attention.compress_ratios has {len(ratios_all)} entries for {num_layers} layers")
        ratios = tuple(ratios_all[:num_layers])
        types = key("attention.indexer.types", None)
        if types is not None:
            indexed = tuple(bool(int(t)) for t in list(types)[:num_layers])
        else:
            nonzero = [r for r in ratios if r > 0]
            csa = min(nonzero) if len(set(nonzero)) > 1 else None
            indexed = tuple(r > 0 and r == csa for r in ratios)
        if not source.has_tensor("token_embd.weight"):
            raise ModelLoadError(path, "missing tensor 'token_embd.weight'")
        vocab = int(source.tensor_shape("token_embd.weight")[0])
        head_dim = int(key("attention.key_length"))
        yarn = None
        if str(key("rope.scaling.type", "none") or "none").lower() == "yarn":
            yarn = {
                "factor": float(key("rope.scaling.factor")),
                "original_context": int(key("rope.scaling.original_context_length")),
                "beta_fast": float(key("rope.scaling.yarn_beta_fast", 32.0) or 32.0),
                "beta_slow": float(key("rope.scaling.yarn_beta_slow", 1.0) or 1.0),
            }
        gating = key("expert_gating_func", 4)
        scoring = SCORING.get(int(gating), f"#{gating}") if not isinstance(gating, str) else gating
        limit = key("swiglu_clamp_exp", 0.0)
        if isinstance(limit, list):
            limit = max((float(v) for v in limit), default=0.0)
        num_heads = int(key("attention.head_count"))
        hp = cls(
            vocab_size=vocab,
            hidden_size=hidden,
            num_layers=num_layers,
            context_length=int(key("context_length", DEFAULT_CONTEXT)),
            rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            num_heads=num_heads,
            head_dim=head_dim,
            q_lora_rank=int(key("attention.q_lora_rank")),
            o_groups=int(key("attention.output_group_count", 1)),
            o_lora_rank=int(key("attention.output_lora_rank")),
            rope_dims=int(key("rope.dimension_count", 64)),
            rope_base=float(key("rope.freq_base", 10000.0)),
            compress_rope_base=float(key("attention.compress_rope_freq_base", 160000.0)),
            compress_yarn=yarn,
            sliding_window=int(key("attention.sliding_window", 128)),
            compress_ratios=ratios,
            indexed=indexed,
            index_heads=int(key("attention.indexer.head_count", 0)),
            index_head_dim=int(key("attention.indexer.key_length", 0)),
            index_topk=int(key("attention.indexer.top_k", 0)),
            num_experts=int(key("expert_count")),
            experts_per_token=int(key("expert_used_count")),
            expert_ffn_size=int(key("expert_feed_forward_length")),
            shared_ffn_size=int(key("expert_shared_feed_forward_length", 0) or key("expert_feed_forward_length")),
            routed_scale=float(key("expert_weights_scale", 1.0)),
            scoring=scoring,
            hash_layers=int(key("hash_layer_count", 0)),
            swiglu_limit=float(limit),
            hc_mult=int(key("hyper_connection.count", 1)),
            hc_iters=int(key("hyper_connection.sinkhorn_iterations", 20)),
            hc_eps=float(key("hyper_connection.epsilon", 1e-6)),
            nextn_layers=nextn,
            mtp_compress_ratio=ratios_all[num_layers] if len(ratios_all) > num_layers else 0,
        )
        hp.check(path)
        return hp
