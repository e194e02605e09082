"""DFlashConfig: the hyper-parameters of a DFlash / DFlash2 drafter file, and their GGUF keys.

A drafter file is ``general.architecture = dflash``; its keys are ``dflash.<name>``. Some
converters write ``general.architecture = dflash-draft`` with the keys under
``dflash-draft.<name>`` or ``dflash-draft.dflash.<name>``: every spelling is accepted, so the
file's architecture, not its name, decides what it is.

``dflash.target_layers`` names the target residuals ENTERING those layers: HF
``target_layer_ids`` name layer OUTPUTS and the converter writes ``id + 1`` (model-specs trap 3;
Muse-Glimmer's HF ``[1, 13, 25, 37, 49]`` is GGUF ``[2, 14, 26, 38, 50]``). Older converters
wrote the raw HF ids; nothing in such a file says so, and it reads one layer early: reconvert it
with ``tsspec convert-dflash``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs

from tsspec.errors import ModelLoadError

__all__ = [
    "ARCHITECTURES",
    "DFlashConfig",
    "KEY",
    "MASK_TOKEN_KEY",
    "LEGACY_MASK_TOKEN_KEY",
    "config_from_gguf",
    "ring_rows_for",
]

ARCHITECTURES = ("dflash", "dflash-draft")
MAIN_ARCH = "dflash"
# logical key -> suffix after the architecture prefix (the GGUF spelling)
KEY = {
    "num_layers": "block_count",
    "hidden_size": "embedding_length",
    "ffn_size": "feed_forward_length",
    "n_head": "attention.head_count",
    "n_head_kv": "attention.head_count_kv",
    "key_length": "attention.key_length",
    "value_length": "attention.value_length",
    "rope_base": "rope.freq_base",
    "eps": "attention.layer_norm_rms_epsilon",
    "block_size": "block_size",
    "target_layers": "target_layers",
    "target_hidden_size": "target_hidden_size",
    "sliding_window": "attention.sliding_window",
    "sliding_window_pattern": "attention.sliding_window_pattern",
    "conv_kernel_size": "conv_kernel_size",
    "conv_group_size": "conv_group_size",
    "selector_rank": "selector_rank",
    "selector_top_k": "selector_top_k",
    "logit_scale": "logit_scale",
    "final_logit_softcapping": "final_logit_softcapping",
    "vocab_size": "vocab_size",
    "mask_token_id": "mask_token_id",  # the older spelling; newer files use MASK_TOKEN_KEY
    "draft_vocab": "draft_vocab",  # optional: target ids of the file's own LM-head rows (FR-Spec)
}
MASK_TOKEN_KEY = "tokenizer.ggml.mask_token_id"
LEGACY_MASK_TOKEN_KEY = "dflash.mask_token_id"
# keys that mark a DSpark drafter (DeepSeek V4) stored under the dflash architecture
DSPARK_MARKERS = ("hyper_connection.count", "markov_rank")

DEFAULT_ROPE_BASE = 10000.0
DEFAULT_EPS = 1e-6
RING_ALIGN = 32  # ring rows are padded to a multiple of this (one device tile)


def ring_rows_for(window: int, block_size: int) -> int:
    """Rows of a sliding KV ring: the window, the block and one spare, padded to RING_ALIGN.

    A slot is reused only after ``rows`` newer positions, more than any row's window reaches, so
    a stale entry can always be told apart by its position.
    """
    need = window + block_size + 1
    return -(-need // RING_ALIGN) * RING_ALIGN


@attrs.frozen
class DFlashConfig:
    """Everything the drafter's math needs; one code path serves DFlash and DFlash2."""

    num_layers: int
    hidden_size: int  # drafter width; equals the target's (it borrows embedding and LM head)
    ffn_size: int
    n_head: int
    n_head_kv: int
    head_dim: int  # attention.key_length
    value_dim: int  # attention.value_length
    rope_base: float
    eps: float
    block_size: int  # block width INCLUDING the anchor row: block_size - 1 drafts per pass
    target_layers: tuple[int, ...]  # residual ENTERING these target layers (GGUF convention)
    target_hidden_size: int
    mask_token_id: int
    sliding_window: int | None = None  # None: every layer attends the whole context
    sliding_layers: tuple[bool, ...] = ()  # per layer; empty = all sliding when a window is set
    conv_kernel_size: int | None = None  # DFlash2 grouped dynamic conv (None: absent)
    conv_group_size: int | None = None
    selector_rank: int | None = None  # DFlash2 candidate selector (None: absent)
    selector_top_k: int | None = None
    logit_scale: float = 1.0  # the target's logit transform, for the selector's unary term
    logit_softcap: float | None = None
    vocab_size: int | None = None  # when the file states one
    architecture: str = MAIN_ARCH
    # a draft vocabulary (trained drafters): the target ids of the rows of the file's own
    # ``output.weight`` [K, H]; the drafter then scores only those K tokens, never the target's
    # full LM head. None: the target's LM head, as in converted checkpoints.
    draft_vocab: tuple[int, ...] | None = None

    @property
    def draft_vocab_size(self) -> int | None:
        return len(self.draft_vocab) if self.draft_vocab else None

    @property
    def feature_size(self) -> int:
        """Width of one concatenated tap row the encoder reads."""
        return len(self.target_layers) * self.target_hidden_size

    @property
    def has_conv(self) -> bool:
        return bool(self.conv_kernel_size) and bool(self.conv_group_size)

    @property
    def has_selector(self) -> bool:
        return bool(self.selector_rank) and bool(self.selector_top_k)

    @property
    def conv_groups(self) -> int:
        return self.hidden_size // int(self.conv_group_size or 1)

    def layer_is_sliding(self, layer: int) -> bool:
        if self.sliding_window is None:
            return False
        if not self.sliding_layers:
            return True
        return bool(self.sliding_layers[layer])

    @property
    def ring_rows(self) -> int | None:
        """Rows of the sliding ring, or None when no layer slides."""
        if self.sliding_window is None:
            return None
        return ring_rows_for(self.sliding_window, self.block_size)


def _pattern(value: Any, num_layers: int, fail: Callable[[str], Exception]) -> tuple[bool, ...]:
    """``sliding_window_pattern``: a per-layer bool array, or a period n (every n-th layer,
    counting from 1, is global; the rest slide), as llama.cpp writes it."""
    if value is None:
        return ()
    if isinstance(value, list):
        if len(value) != num_layers:
            raise fail(f"attention.sliding_window_pattern has {len(value)} entries for {num_layers} layers")
        return tuple(bool(v) for v in value)
    period = int(value)
    if period <= 0:
        raise fail(f"attention.sliding_window_pattern must be positive, got {period}")
    return tuple((i + 1) % period != 0 for i in range(num_layers)) if period > 1 else (True,) * num_layers


def config_from_gguf(gguf_file: Any) -> DFlashConfig:
    """Read and check a DFlashConfig from an open ``tsspec_gguf.gguf_file.GGUFFile``.

    Raises ModelLoadError naming the file and the first problem found.
    """
    path = gguf_file.path

    def fail(problem: str) -> ModelLoadError:
        return ModelLoadError(path, problem)

    arch = gguf_file.architecture
    if arch not in ARCHITECTURES:
        raise fail(
            f"general.architecture is {arch!r}, not a DFlash drafter (expected one of {', '.join(ARCHITECTURES)})"
        )
    prefixes = [f"{arch}.", f"{arch}.dflash."] if arch != MAIN_ARCH else [f"{arch}."]

    def spelled(name: str) -> str | None:
        for prefix in prefixes:
            if prefix + name in gguf_file:
                return prefix + name
        return None

    def get(logical: str, kind: type, default: Any = ...) -> Any:
        key = spelled(KEY[logical])
        if key is None:
            if default is ...:
                raise fail(f"missing metadata key {prefixes[0] + KEY[logical]!r}")
            return default
        return gguf_file.require(key, kind)

    for marker in DSPARK_MARKERS:
        key = spelled(marker)
        if key is not None and gguf_file.get(key) not in (0, False, None):
            raise fail(
                f"this is a DSpark drafter ({key} is set), not a DFlash one; it is served by "
                "the DeepSeek V4 model plugin, not by the block plugin's DFlash drafter"
            )

    num_layers = get("num_layers", int)
    hidden = get("hidden_size", int)
    n_head = get("n_head", int)
    n_head_kv = get("n_head_kv", int, n_head)
    head_dim = get("key_length", int, hidden // max(n_head, 1))
    mask = gguf_file.get(MASK_TOKEN_KEY, None)
    if mask is None:
        mask = get("mask_token_id", int, None)
    if mask is None:
        raise fail(f"missing the mask token id ({MASK_TOKEN_KEY!r} or {prefixes[0]}mask_token_id)")
    layers = get("target_layers", list)
    if not layers:
        raise fail(f"{prefixes[0]}target_layers is empty: the drafter reads no target layer")
    window = get("sliding_window", int, None)
    cfg = DFlashConfig(
        num_layers=num_layers,
        hidden_size=hidden,
        ffn_size=get("ffn_size", int),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        value_dim=get("value_length", int, head_dim),
        rope_base=float(get("rope_base", float, DEFAULT_ROPE_BASE)),
        eps=float(get("eps", float, DEFAULT_EPS)),
        block_size=get("block_size", int),
        target_layers=tuple(int(v) for v in layers),
        target_hidden_size=get("target_hidden_size", int, hidden),
        mask_token_id=int(mask),
        sliding_window=int(window) if window else None,
        sliding_layers=_pattern(get("sliding_window_pattern", object, None), num_layers, fail),
        conv_kernel_size=get("conv_kernel_size", int, None),
        conv_group_size=get("conv_group_size", int, None),
        selector_rank=get("selector_rank", int, None),
        selector_top_k=get("selector_top_k", int, None),
        logit_scale=float(get("logit_scale", float, 1.0)),
        logit_softcap=float(get("final_logit_softcapping", float, 0.0)) or None,
        vocab_size=get("vocab_size", int, None),
        architecture=arch,
        draft_vocab=_draft_vocab(get("draft_vocab", list, None)),
    )
    check_config(cfg, fail)
    return cfg


def _draft_vocab(value: Any) -> tuple[int, ...] | None:
    return tuple(int(v) for v in value) if value else None


def check_config(cfg: DFlashConfig, fail: Callable[[str], Exception]) -> None:
    """Internal consistency of a config (target fit is checked at attach time)."""
    positive = {
        "block_count": cfg.num_layers,
        "embedding_length": cfg.hidden_size,
        "feed_forward_length": cfg.ffn_size,
        "attention.head_count": cfg.n_head,
        "attention.head_count_kv": cfg.n_head_kv,
        "attention.key_length": cfg.head_dim,
        "attention.value_length": cfg.value_dim,
        "target_hidden_size": cfg.target_hidden_size,
    }
    for name, value in positive.items():
        if value <= 0:
            raise fail(f"dflash.{name} must be positive, got {value}")
    if cfg.block_size < 2:
        raise fail(f"dflash.block_size must be at least 2 (anchor + one draft), got {cfg.block_size}")
    if cfg.n_head % cfg.n_head_kv:
        raise fail(f"attention.head_count {cfg.n_head} is not a multiple of head_count_kv {cfg.n_head_kv}")
    if cfg.head_dim % 2:
        raise fail(f"attention.key_length {cfg.head_dim} is odd: NeoX RoPE needs an even head size")
    if any(layer < 0 for layer in cfg.target_layers):
        raise fail(f"dflash.target_layers has a negative layer id: {list(cfg.target_layers)}")
    if cfg.sliding_window is not None and cfg.sliding_window < 1:
        raise fail(f"attention.sliding_window must be positive, got {cfg.sliding_window}")
    if cfg.mask_token_id < 0:
        raise fail(f"mask token id must be non-negative, got {cfg.mask_token_id}")
    if bool(cfg.conv_kernel_size) != bool(cfg.conv_group_size):
        raise fail("dflash.conv_kernel_size and dflash.conv_group_size must be given together")
    if cfg.has_conv and cfg.hidden_size % int(cfg.conv_group_size):
        raise fail(
            f"dflash.conv_group_size {cfg.conv_group_size} does not divide embedding_length {cfg.hidden_size}"
        )
    if bool(cfg.selector_rank) != bool(cfg.selector_top_k):
        raise fail("dflash.selector_rank and dflash.selector_top_k must be given together")
    if cfg.draft_vocab is not None:
        if cfg.has_selector:
            raise fail("dflash.draft_vocab and the DFlash2 selector cannot be combined (the selector scores the "
                       "whole vocabulary)")
        if min(cfg.draft_vocab) < 0 or len(set(cfg.draft_vocab)) != len(cfg.draft_vocab):
            raise fail("dflash.draft_vocab must list distinct non-negative token ids")
    if cfg.logit_softcap is not None and cfg.logit_softcap < 0:
        raise fail(f"dflash.final_logit_softcapping must be positive, got {cfg.logit_softcap}")


def hf_target_ids_to_gguf(ids: Sequence[int]) -> list[int]:
    """HF ``target_layer_ids`` (layer OUTPUTS) -> GGUF ``dflash.target_layers`` (the residual
    ENTERING the next layer): ``id + 1`` (model-specs trap 3)."""
    return [int(i) + 1 for i in ids]
