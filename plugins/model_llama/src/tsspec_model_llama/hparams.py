"""The hyper-parameters of a llama-family GGUF, read and checked once.

llama.cpp's ``llama`` architecture keys (prefix ``llama.``): ``block_count``,
``embedding_length``, ``feed_forward_length``, ``attention.head_count``,
``attention.head_count_kv`` (GQA; absent = MHA), ``attention.key_length`` (head dim; absent =
hidden / heads), ``attention.layer_norm_rms_epsilon``, ``rope.freq_base`` (default 10000),
``rope.dimension_count`` (rotated dims per head; absent = head dim), ``rope.scaling.type`` and
``rope.scaling.factor`` (``linear`` is supported; llama-3.1 style scaling arrives as a
``rope_freqs.weight`` tensor of per-frequency divisors), ``context_length``. Other families
(``families.py``) add ``attention.sliding_window``, ``rope.freq_base_swa``,
``attention.scale``, ``attn_logit_softcapping`` and ``final_logit_softcapping``.
"""

from __future__ import annotations

from typing import Any

import attrs

from tsspec.errors import ModelLoadError

from .families import Family, family_of

DEFAULT_ROPE_BASE = 10000.0
SUPPORTED_ROPE_SCALING = ("none", "linear")


@attrs.frozen
class LlamaHParams:
    architecture: str
    n_layers: int
    hidden_size: int
    ffn_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_linear_factor: float  # positions are divided by it (1.0 = no scaling)
    family: Family = attrs.field(factory=lambda: family_of("llama"))
    attention_scale: float = 0.0  # multiplies Q (0: 1 / sqrt(head_dim))
    sliding_window: int = 0  # keys a sliding layer's row sees, itself included (0: none)
    rope_base_local: float = 0.0  # RoPE base of sliding layers (0: rope_base)
    attn_softcap: float = 0.0  # scores -> c * tanh(scores / c) (0: off)
    final_softcap: float = 0.0  # logits -> c * tanh(logits / c) (0: off)

    @property
    def q_scale(self) -> float:
        return self.attention_scale or self.head_dim**-0.5

    def sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends over a sliding window (the family's pattern)."""
        period = self.family.swa_period
        return bool(self.sliding_window and period and layer % period < period - 1)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_heads // self.n_kv_heads

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    def as_extra(self) -> dict[str, Any]:
        """The facts a drafter may need, for ``ModelConfig.extra``."""
        return {
            "ffn_size": self.ffn_size,
            "num_heads": self.n_heads,
            "num_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_eps,
            "rope_theta": self.rope_base,
            "rope_dim": self.rope_dim,
            "rope_scaling_factor": self.rope_linear_factor,
            "family": attrs.asdict(self.family),
            "sliding_window": self.sliding_window,
            "final_logit_softcapping": self.final_softcap,
        }


def _positive_int(gguf_file, key: str, default: Any = None) -> int:
    value = gguf_file.get(key, default) if default is not None else gguf_file.require(key)
    if isinstance(value, list):
        if not value or any(v != value[0] for v in value):
            raise ModelLoadError(gguf_file.path, f"{key} varies per layer ({value[:8]}...), not supported")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelLoadError(gguf_file.path, f"{key} must be a positive integer, got {value!r}")
    return value


def _positive_float(gguf_file, key: str) -> float:
    """A positive number under ``key``, 0.0 when absent."""
    value = gguf_file.get(key, None)
    if value is None:
        return 0.0
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ModelLoadError(gguf_file.path, f"{key} must be a positive number, got {value!r}")
    return float(value)


def read_hparams(gguf_file) -> LlamaHParams:
    """The hyper-parameters, with a ModelLoadError naming the key for anything inconsistent."""
    arch = gguf_file.architecture
    family = family_of(arch)
    if family is None:
        raise ModelLoadError(gguf_file.path, f"architecture {arch!r} is not a family this plugin serves")
    key = gguf_file.arch_key
    n_layers = _positive_int(gguf_file, key("block_count"))
    hidden = _positive_int(gguf_file, key("embedding_length"))
    ffn = _positive_int(gguf_file, key("feed_forward_length"))
    window = 0
    if family.swa_period and gguf_file.get(key("attention.sliding_window"), None) is not None:
        window = _positive_int(gguf_file, key("attention.sliding_window"))
    n_heads = _positive_int(gguf_file, key("attention.head_count"))
    n_kv = _positive_int(gguf_file, key("attention.head_count_kv"), n_heads)
    if n_heads % n_kv:
        raise ModelLoadError(gguf_file.path, f"{n_heads} attention heads do not group over {n_kv} KV heads")
    if hidden % n_heads and not gguf_file.get(key("attention.key_length"), None):
        raise ModelLoadError(gguf_file.path, f"hidden size {hidden} is not a multiple of {n_heads} heads")
    head_dim = _positive_int(gguf_file, key("attention.key_length"), hidden // n_heads or 1)
    value_dim = _positive_int(gguf_file, key("attention.value_length"), head_dim)
    if value_dim != head_dim:
        raise ModelLoadError(gguf_file.path, f"value length {value_dim} differs from key length {head_dim}")
    rope_dim = _positive_int(gguf_file, key("rope.dimension_count"), head_dim)
    if rope_dim > head_dim or rope_dim % 2:
        raise ModelLoadError(gguf_file.path, f"rope.dimension_count {rope_dim} must be even and <= {head_dim}")
    eps = gguf_file.require(key("attention.layer_norm_rms_epsilon"), float)
    base = gguf_file.get(key("rope.freq_base"), DEFAULT_ROPE_BASE)
    if not isinstance(base, (int, float)) or isinstance(base, bool) or base <= 0:
        raise ModelLoadError(gguf_file.path, f"rope.freq_base must be positive, got {base!r}")
    scaling = str(gguf_file.get(key("rope.scaling.type"), "none") or "none")
    factor = float(gguf_file.get(key("rope.scaling.factor"), 0.0) or 0.0)
    legacy_linear = gguf_file.get(key("rope.scale_linear"), None)
    if legacy_linear is not None:
        scaling, factor = "linear", float(legacy_linear)
    if scaling not in SUPPORTED_ROPE_SCALING:
        raise ModelLoadError(
            gguf_file.path, f"rope scaling {scaling!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_SCALING)})"
        )
    linear = factor if scaling == "linear" and factor > 0 else 1.0
    context = _positive_int(gguf_file, key("context_length"))
    vocab = gguf_file.tensor_shape("token_embd.weight")[0]
    if gguf_file.has_tensor("rope_factors_long.weight") or scaling in ("longrope", "su", "yarn"):
        raise ModelLoadError(gguf_file.path, "long-context RoPE scaling (rope_factors_long/short, YaRN) is not supported")
    local_base = _positive_float(gguf_file, key("rope.freq_base_swa")) or float(family.local_rope_base or base)
    softcaps = (_positive_float(gguf_file, key("attn_logit_softcapping")), _positive_float(gguf_file, key("final_logit_softcapping")))
    if not family.soft_capping:
        softcaps = (0.0, 0.0)
    return LlamaHParams(
        architecture=arch,
        n_layers=n_layers,
        hidden_size=hidden,
        ffn_size=ffn,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=vocab,
        context_length=context,
        rms_eps=float(eps),
        rope_base=float(base),
        rope_dim=rope_dim,
        rope_linear_factor=linear,
        family=family,
        attention_scale=_positive_float(gguf_file, key("attention.scale"))
        or ((hidden / n_heads) ** -0.5 if n_layers in family.scale_by_hidden_at_layers else 0.0),
        sliding_window=window,
        rope_base_local=local_base,
        attn_softcap=softcaps[0],
        final_softcap=softcaps[1],
    )
