"""Hyperparameters of a Qwen 3.5 / 3.6 / 3.8 or Qwen3-Next trunk, read from GGUF metadata.

One frozen record holds every architecture fact the torch code needs, so the layers never look
at metadata keys or architecture names. The architecture decides only two things, and both
become fields here: the FFN kind (``qwen35`` is dense, ``qwen35moe`` and ``qwen3next`` are MoE)
and the value-head order of the Gated DeltaNet layers:

* ``qwen35`` / ``qwen35moe`` files store V heads TILED: value head j reads key head ``j % num_k``.
* ``qwen3next`` files keep Hugging Face's GROUPED order: value head j reads key head ``j // r``.

Layer pattern: a ``{arch}.attention.recurrent_layers`` array when present, else layer i is a
Gated DeltaNet layer when ``(i + 1) % full_attention_interval != 0``. ``block_count`` counts the
NextN/MTP blocks too; ``num_layers`` here is the trunk only.
"""

from __future__ import annotations

from typing import Any

import attrs

from tsspec.errors import ModelLoadError

ARCH_QWEN35 = "qwen35"
ARCH_QWEN35MOE = "qwen35moe"
ARCH_QWEN3NEXT = "qwen3next"
ARCHITECTURES = (ARCH_QWEN35, ARCH_QWEN35MOE, ARCH_QWEN3NEXT)
MOE_ARCHITECTURES = frozenset({ARCH_QWEN35MOE, ARCH_QWEN3NEXT})
GROUPED_V_ARCHITECTURES = frozenset({ARCH_QWEN3NEXT})

V_ORDER_TILED = "tiled"  # value head j uses key head j % num_k (qwen35, qwen35moe)
V_ORDER_GROUPED = "grouped"  # value head j uses key head j // (num_v // num_k) (qwen3next, HF)

DEFAULT_FULL_ATTENTION_INTERVAL = 4
DEFAULT_CONV_KERNEL = 4
DEFAULT_RMS_EPS = 1e-6
DEFAULT_ROPE_BASE = 10_000_000.0
DEFAULT_CONTEXT = 4096
RECURRENT_LAYERS_KEY = "attention.recurrent_layers"  # optional per-layer bool array


def layer_pattern(num_layers: int, interval: int) -> tuple[bool, ...]:
    """Which trunk layers are recurrent (Gated DeltaNet), from the full-attention interval.

    >>> layer_pattern(8, 4)
    (True, True, True, False, True, True, True, False)
    """
    if interval < 1:
        raise ValueError(f"full_attention_interval must be >= 1, got {interval}")
    return tuple((i + 1) % interval != 0 for i in range(num_layers))


@attrs.frozen
class Qwen35HParams:
    """Everything the trunk, the MTP head and the loader need to know about the model."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int  # trunk layers (block_count minus the NextN blocks)
    recurrent: tuple[bool, ...]  # per trunk layer: True = Gated DeltaNet, False = full attention
    context_length: int
    rms_eps: float
    # gated full attention
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_dims: int  # rotated dims per head (partial NeoX RoPE over the first rope_dims)
    rope_base: float
    # Gated DeltaNet
    conv_kernel: int
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    v_order: str  # V_ORDER_TILED | V_ORDER_GROUPED
    # FFN: dense when num_experts == 0
    ffn_size: int
    num_experts: int = 0
    experts_per_token: int = 0
    expert_ffn_size: int = 0
    shared_expert_ffn_size: int = 0
    norm_top_k: bool = True
    nextn_layers: int = 0  # NextN / MTP blocks stored after the trunk (blk.{num_layers}..)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: all-Q | all-K | all-V."""
        return 2 * self.key_dim + self.value_dim

    @property
    def v_per_k(self) -> int:
        return self.num_v_heads // self.num_k_heads

    def key_head_of_value_head(self) -> list[int]:
        """For each value head, the key head it reads (the file's V-head order decides)."""
        if self.v_order == V_ORDER_TILED:
            return [j % self.num_k_heads for j in range(self.num_v_heads)]
        return [j // self.v_per_k for j in range(self.num_v_heads)]

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, rec in enumerate(self.recurrent) if not rec]

    @property
    def recurrent_layers(self) -> list[int]:
        return [i for i, rec in enumerate(self.recurrent) if rec]

    def check(self, path: object = "<memory>") -> None:
        """Reject inconsistent dimensions with a clear error instead of a shape crash later."""
        problems = []
        if self.architecture not in ARCHITECTURES:
            problems.append(f"architecture {self.architecture!r} is not one of {', '.join(ARCHITECTURES)}")
        if self.num_heads % max(self.num_kv_heads, 1):
            problems.append(f"{self.num_heads} attention heads are not a multiple of {self.num_kv_heads} KV heads")
        if self.num_k_heads < 1 or self.num_v_heads % self.num_k_heads:
            problems.append(f"{self.num_v_heads} value heads are not a multiple of {self.num_k_heads} key heads")
        if not 0 < self.rope_dims <= self.head_dim or self.rope_dims % 2:
            problems.append(f"rope dimension count {self.rope_dims} does not fit head_dim {self.head_dim}")
        if self.conv_kernel < 1:
            problems.append(f"conv kernel {self.conv_kernel} must be >= 1")
        if self.is_moe and not 0 < self.experts_per_token <= self.num_experts:
            problems.append(f"{self.experts_per_token} experts per token out of {self.num_experts}")
        if len(self.recurrent) != self.num_layers:
            problems.append("layer pattern length differs from the layer count")
        if problems:
            raise ModelLoadError(path, "; ".join(problems))

    @classmethod
    def from_gguf(cls, source: Any) -> "Qwen35HParams":
        """Read from a ``GGUFFile`` (or anything with its ``get``/``arch_key``/tensor methods)."""
        path = getattr(source, "path", "<memory>")
        arch = source.architecture
        if arch not in ARCHITECTURES:
            raise ModelLoadError(path, f"architecture {arch!r} is not served by tsspec-model-qwen35")

        def key(suffix: str, default: Any = ...) -> Any:
            name = source.arch_key(suffix)
            return source.get(name) if default is ... else source.get(name, default)

        hidden = int(key("embedding_length"))
        block_count = int(key("block_count"))
        nextn = int(key("nextn_predict_layers", 0) or 0)
        num_layers = block_count - nextn
        if num_layers < 1:
            raise ModelLoadError(path, f"block_count {block_count} leaves no trunk layers after {nextn} NextN blocks")
        pattern = key(RECURRENT_LAYERS_KEY, None)
        if pattern is not None:
            recurrent = tuple(bool(v) for v in list(pattern)[:num_layers])
        else:
            interval = int(key("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL))
            recurrent = layer_pattern(num_layers, interval)
        num_heads = int(key("attention.head_count"))
        num_kv = key("attention.head_count_kv", num_heads)
        if isinstance(num_kv, list):  # per-layer arrays: every attention layer shares one value
            num_kv = max(int(v) for v in num_kv)
        head_dim = int(key("attention.key_length", hidden // num_heads))
        state_size = int(key("ssm.state_size"))
        num_k = int(key("ssm.group_count"))
        num_v = int(key("ssm.time_step_rank"))
        inner = int(key("ssm.inner_size", num_v * state_size))
        if source.has_tensor("token_embd.weight"):
            vocab = int(source.tensor_shape("token_embd.weight")[0])
        else:
            raise ModelLoadError(path, "missing tensor 'token_embd.weight'")
        is_moe = arch in MOE_ARCHITECTURES
        hp = cls(
            architecture=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            num_layers=num_layers,
            recurrent=recurrent,
            context_length=int(key("context_length", DEFAULT_CONTEXT)),
            rms_eps=float(key("attention.layer_norm_rms_epsilon", DEFAULT_RMS_EPS)),
            num_heads=num_heads,
            num_kv_heads=int(num_kv),
            head_dim=head_dim,
            rope_dims=int(key("rope.dimension_count", head_dim)),
            rope_base=float(key("rope.freq_base", DEFAULT_ROPE_BASE)),
            conv_kernel=int(key("ssm.conv_kernel", DEFAULT_CONV_KERNEL)),
            num_k_heads=num_k,
            num_v_heads=num_v,
            k_head_dim=state_size,
            v_head_dim=inner // num_v,
            v_order=V_ORDER_GROUPED if arch in GROUPED_V_ARCHITECTURES else V_ORDER_TILED,
            ffn_size=int(key("feed_forward_length", 0) or 0) if not is_moe else 0,
            num_experts=int(key("expert_count", 0)) if is_moe else 0,
            experts_per_token=int(key("expert_used_count", 0)) if is_moe else 0,
            expert_ffn_size=int(key("expert_feed_forward_length", 0)) if is_moe else 0,
            shared_expert_ffn_size=int(key("expert_shared_feed_forward_length", 0)) if is_moe else 0,
            norm_top_k=bool(key("expert_weights_norm", True)) if is_moe else True,
            nextn_layers=nextn,
        )
        hp.check(path)
        return hp
