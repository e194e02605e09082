"""The hyper-parameters of a ``gemma4`` or ``gemma4-assistant`` GGUF, read and checked once.

Keys (llama.cpp's names, prefix ``{arch}.``): ``block_count``, ``context_length``,
``embedding_length``, ``feed_forward_length`` (a number or one per layer: the double-wide MLP
of KV-shared layers), ``attention.head_count``, ``attention.head_count_kv`` (a number or one
per layer), ``attention.key_length`` (full layers' head dim), ``attention.key_length_swa``
(sliding layers'), ``attention.layer_norm_rms_epsilon``, ``attention.sliding_window``,
``attention.sliding_window_pattern`` (one bool per layer, True = sliding),
``attention.shared_kv_layers``, ``embedding_length_per_layer_input`` (0: none),
``rope.freq_base`` / ``rope.freq_base_swa``, ``rope.dimension_count_swa``,
``final_logit_softcapping``, ``expert_count`` / ``expert_used_count`` /
``expert_feed_forward_length`` (MoE), and for the assistant ``embedding_length_out`` (the
target's width). The full layers' partial ("proportional") RoPE is the ``rope_freqs`` tensor.
"""

from __future__ import annotations

from typing import Any

import attrs

from tsspec.errors import ModelLoadError

ARCH = "gemma4"
ASSISTANT_ARCH = "gemma4-assistant"


@attrs.frozen
class Gemma4HParams:
    arch: str
    n_layers: int
    hidden_size: int
    n_heads: int
    head_dim_swa: int
    head_dim_full: int
    n_kv: tuple[int, ...]  # [n_layers] KV heads per layer
    ffn: tuple[int, ...]  # [n_layers] MLP width per layer
    vocab_size: int
    context_length: int
    rms_eps: float
    sliding_window: int
    sliding: tuple[bool, ...]  # [n_layers]
    rope_base: float  # full layers
    rope_base_swa: float
    rope_dims_swa: int  # rotated dims of a sliding head
    softcap: float | None
    n_kv_shared: int  # the last n layers read an earlier layer's K/V
    ple_dim: int  # per-layer input width (0: none)
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn: int = 0
    backbone_size: int = 0  # assistant: the target's hidden size

    def head_dim(self, i: int) -> int:
        return self.head_dim_swa if self.sliding[i] else self.head_dim_full

    @property
    def first_shared(self) -> int:
        return self.n_layers - self.n_kv_shared

    def store_layer(self, sliding: bool) -> int | None:
        """The last layer of this type that computes its own K/V (what shared layers and an
        assistant read), or None."""
        own = [i for i in range(self.first_shared) if self.sliding[i] == sliding]
        return own[-1] if own else None

    @property
    def kv_source(self) -> tuple[int, ...]:
        """[n_layers] the layer whose K/V each layer attends to (itself when not shared)."""
        return tuple(i if i < self.first_shared else self.store_layer(self.sliding[i]) for i in range(self.n_layers))

    def as_extra(self) -> dict[str, Any]:
        return {
            "num_heads": self.n_heads, "num_kv_heads": list(self.n_kv), "head_dim": self.head_dim_swa,
            "global_head_dim": self.head_dim_full, "ffn_sizes": list(self.ffn), "rms_norm_eps": self.rms_eps,
            "sliding_window": self.sliding_window, "layer_sliding": list(self.sliding),
            "rope_theta": self.rope_base, "rope_theta_swa": self.rope_base_swa,
            "final_logit_softcapping": self.softcap, "num_kv_shared_layers": self.n_kv_shared,
            "hidden_size_per_layer_input": self.ple_dim, "num_experts": self.n_experts,
        }


def _int(gf, key: str, default: Any = None, minimum: int = 1) -> int:
    value = gf.get(key, default) if default is not None else gf.require(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ModelLoadError(gf.path, f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _float(gf, key: str, default: float | None = None) -> float:
    value = gf.get(key, default) if default is not None else gf.require(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ModelLoadError(gf.path, f"{key} must be a number, got {value!r}")
    return float(value)


def _per_layer(gf, key: str, n: int, default: Any = None) -> tuple[int, ...]:
    value = gf.get(key, default) if default is not None else gf.require(key)
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list):
        if len(value) != n or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in value):
            raise ModelLoadError(gf.path, f"{key} must hold one positive integer per layer ({n})")
        return tuple(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelLoadError(gf.path, f"{key} must be a positive integer, got {value!r}")
    return (value,) * n


def read_hparams(gf) -> Gemma4HParams:
    """The hyper-parameters, with a ModelLoadError naming the key for anything inconsistent."""
    key, path, arch = gf.arch_key, gf.path, gf.architecture
    n = _int(gf, key("block_count"))
    n_heads = _int(gf, key("attention.head_count"))
    n_kv = _per_layer(gf, key("attention.head_count_kv"), n, n_heads)
    if any(n_heads % k for k in n_kv):
        raise ModelLoadError(path, f"{n_heads} attention heads do not group over KV heads {list(n_kv)}")
    hd_full = _int(gf, key("attention.key_length"))
    hd_swa = _int(gf, key("attention.key_length_swa"), hd_full)
    if hd_full % 2 or hd_swa % 2:
        raise ModelLoadError(path, "head dims must be even (RoPE turns pairs)")
    pattern = gf.get(key("attention.sliding_window_pattern"), None)
    if hasattr(pattern, "tolist"):
        pattern = pattern.tolist()
    if not isinstance(pattern, list) or len(pattern) != n:
        raise ModelLoadError(path, f"{key('attention.sliding_window_pattern')} must hold one bool per layer ({n})")
    sliding = tuple(bool(v) for v in pattern)
    shared = _int(gf, key("attention.shared_kv_layers"), 0, minimum=0)
    if shared > n:
        raise ModelLoadError(path, f"attention.shared_kv_layers {shared} exceeds block_count {n}")
    if arch == ARCH and shared and any(
            (i >= n - shared) and not any(sliding[j] == sliding[i] for j in range(n - shared)) for i in range(n)):
        raise ModelLoadError(path, "a KV-shared layer has no earlier layer of its type to read K/V from")
    softcap = _float(gf, key("final_logit_softcapping"), 0.0)
    if softcap < 0:
        raise ModelLoadError(path, f"final_logit_softcapping must not be negative, got {softcap}")
    rope_dims_swa = _int(gf, key("rope.dimension_count_swa"), hd_swa)
    if rope_dims_swa > hd_swa or rope_dims_swa % 2:
        raise ModelLoadError(path, f"rope.dimension_count_swa {rope_dims_swa} must be even and <= {hd_swa}")
    base = _float(gf, key("rope.freq_base"), 1_000_000.0)
    n_experts = _int(gf, key("expert_count"), 0, minimum=0)
    return Gemma4HParams(
        arch=arch, n_layers=n, hidden_size=_int(gf, key("embedding_length")), n_heads=n_heads,
        head_dim_swa=hd_swa, head_dim_full=hd_full, n_kv=n_kv,
        ffn=_per_layer(gf, key("feed_forward_length"), n), vocab_size=gf.tensor_shape("token_embd.weight")[0],
        context_length=_int(gf, key("context_length")), rms_eps=_float(gf, key("attention.layer_norm_rms_epsilon")),
        sliding_window=_int(gf, key("attention.sliding_window")), sliding=sliding, rope_base=base,
        rope_base_swa=_float(gf, key("rope.freq_base_swa"), 10_000.0), rope_dims_swa=rope_dims_swa,
        softcap=softcap or None, n_kv_shared=shared,
        ple_dim=_int(gf, key("embedding_length_per_layer_input"), 0, minimum=0),
        n_experts=n_experts,
        n_experts_used=_int(gf, key("expert_used_count"), 1) if n_experts else 0,
        expert_ffn=_int(gf, key("expert_feed_forward_length"), 1) if n_experts else 0,
        backbone_size=_int(gf, key("embedding_length_out")) if arch == ASSISTANT_ARCH else 0,
    )
