"""The hyper-parameters of a ``muse-glimmer`` GGUF, read and checked once.

Keys (prefix ``muse-glimmer.``, llama.cpp's names): ``block_count``, ``context_length``,
``embedding_length``, ``feed_forward_length``, ``attention.head_count``,
``attention.head_count_kv``, ``attention.key_length`` / ``value_length`` (head dim),
``attention.layer_norm_rms_epsilon`` (pre-norms, QK-norm, embedding norm, final norm),
``attention.sliding_window``, ``attention.sliding_window_pattern`` (a per-layer bool array,
True = sliding; or llama.cpp's scalar period ``n``: layer i slides unless ``i % n == n - 1``),
``rope.freq_base`` and ``rope.freq_base_swa`` (the sliding layers' base; global layers are
NoPE), ``logit_scale`` (HF ``output_multiplier``), ``final_logit_softcapping``.

One key llama.cpp does not have: ``attention.post_norm_rms_epsilon``, the epsilon of the
post-attention and post-FFN norms (llama.cpp hard-codes HF's default 1e-8; absent = 1e-8).
"""

from __future__ import annotations

from typing import Any

import attrs

from tsspec.errors import ModelLoadError

ARCH = "muse-glimmer"
DEFAULT_POST_NORM_EPS = 1e-8
DEFAULT_PATTERN_PERIOD = 4
POST_NORM_EPS_KEY = "attention.post_norm_rms_epsilon"


@attrs.frozen
class MuseGlimmerHParams:
    n_layers: int
    hidden_size: int
    ffn_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rms_eps: float
    post_norm_eps: float
    sliding_window: int  # keys a sliding layer's query sees, itself included
    sliding: tuple[bool, ...]  # [n_layers] True: sliding window + RoPE; False: global, NoPE
    rope_base_swa: float
    logit_scale: float
    softcap: float | None

    @property
    def group_size(self) -> int:
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
            "post_norm_eps": self.post_norm_eps,
            "sliding_window": self.sliding_window,
            "layer_sliding": list(self.sliding),
            "rope_theta_swa": self.rope_base_swa,
            "logit_scale": self.logit_scale,
            "final_logit_softcapping": self.softcap,
        }


def _int(gguf_file, key: str, default: Any = None) -> int:
    value = gguf_file.get(key, default) if default is not None else gguf_file.require(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelLoadError(gguf_file.path, f"{key} must be a positive integer, got {value!r}")
    return value


def _float(gguf_file, key: str, default: float | None = None) -> float:
    value = gguf_file.get(key, default) if default is not None else gguf_file.require(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ModelLoadError(gguf_file.path, f"{key} must be a number, got {value!r}")
    return float(value)


def layer_pattern(value: Any, n_layers: int, path: str, key: str) -> tuple[bool, ...]:
    """Per-layer sliding flags from the pattern key: a bool list, or llama.cpp's period ``n``
    (layer i slides unless ``i % n == n - 1``; 0 = every layer slides)."""
    if isinstance(value, list):
        if len(value) != n_layers or any(not isinstance(v, (bool, int)) for v in value):
            raise ModelLoadError(path, f"{key} must hold one bool per layer ({n_layers}), got {value[:8]!r}")
        return tuple(bool(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelLoadError(path, f"{key} must be a period or a per-layer bool array, got {value!r}")
    if value == 0:
        return (True,) * n_layers
    return tuple(i % value < value - 1 for i in range(n_layers))


def read_hparams(gguf_file) -> MuseGlimmerHParams:
    """The hyper-parameters, with a ModelLoadError naming the key for anything inconsistent."""
    key, path = gguf_file.arch_key, gguf_file.path
    n_layers = _int(gguf_file, key("block_count"))
    hidden = _int(gguf_file, key("embedding_length"))
    n_heads = _int(gguf_file, key("attention.head_count"))
    n_kv = _int(gguf_file, key("attention.head_count_kv"), n_heads)
    if n_heads % n_kv:
        raise ModelLoadError(path, f"{n_heads} attention heads do not group over {n_kv} KV heads")
    head_dim = _int(gguf_file, key("attention.key_length"), max(1, hidden // n_heads))
    if _int(gguf_file, key("attention.value_length"), head_dim) != head_dim:
        raise ModelLoadError(path, "attention.value_length differs from attention.key_length")
    if head_dim % 2:
        raise ModelLoadError(path, f"head dim {head_dim} must be even (RoPE turns pairs)")
    pattern_key = key("attention.sliding_window_pattern")
    sliding = layer_pattern(gguf_file.get(pattern_key, DEFAULT_PATTERN_PERIOD), n_layers, path, pattern_key)
    base = _float(gguf_file, key("rope.freq_base"), 10000.0)
    base_swa = _float(gguf_file, key("rope.freq_base_swa"), base)
    if base_swa <= 0:
        raise ModelLoadError(path, f"rope.freq_base_swa must be positive, got {base_swa}")
    softcap = _float(gguf_file, key("final_logit_softcapping"), 0.0)
    if softcap < 0:
        raise ModelLoadError(path, f"final_logit_softcapping must not be negative, got {softcap}")
    return MuseGlimmerHParams(
        n_layers=n_layers,
        hidden_size=hidden,
        ffn_size=_int(gguf_file, key("feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=gguf_file.tensor_shape("token_embd.weight")[0],
        context_length=_int(gguf_file, key("context_length")),
        rms_eps=_float(gguf_file, key("attention.layer_norm_rms_epsilon")),
        post_norm_eps=_float(gguf_file, key(POST_NORM_EPS_KEY), DEFAULT_POST_NORM_EPS),
        sliding_window=_int(gguf_file, key("attention.sliding_window")),
        sliding=sliding,
        rope_base_swa=base_swa,
        logit_scale=_float(gguf_file, key("logit_scale"), 1.0),
        softcap=softcap or None,
    )
