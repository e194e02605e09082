"""DFlashWeights: the drafter's tensors, read from a GGUF file (or built directly in tests).

GGUF tensor names (llama.cpp's DFlash names); shapes here are numpy order ``[out, in]``::

    fc.weight                  [H, taps * H_target]   encoder projection of the tapped residuals
    enc.output_norm.weight     [H]                    encoder RMSNorm (HF hidden_norm)
    output_norm.weight         [H]                    final RMSNorm (HF norm)
    blk.N.attn_norm / attn_q / attn_k / attn_v / attn_q_norm / attn_k_norm / attn_output
    blk.N.ffn_norm / ffn_gate / ffn_up / ffn_down     (all ``.weight``; optional attn ``.bias``)
    DFlash2:  blk.N.{attn,ffn}_conv_base   [2, K, H]      static taps (side 0 input, side 1 output)
              blk.N.{attn,ffn}_conv_proj   [2*K*G, H]     dynamic taps from the sublayer input
              selector_hidden [r, H], selector_predecessor / selector_successor [vocab, r]
    Draft vocabulary (trained drafters, ``dflash.draft_vocab`` set):
              output.weight          [K, H]         the LM-head rows of the K draft-vocabulary ids

The DFlash2 tensors are read with or without a ``.weight`` suffix (writers differ).
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import torch

from tsspec.errors import ModelLoadError

from .config import DFlashConfig
from .selector import SelectorWeights

__all__ = ["ConvWeights", "LayerWeights", "DFlashWeights", "weights_from_gguf", "tensor_names"]


@attrs.frozen
class ConvWeights:
    """One DFlash2 grouped dynamic conv around a sublayer."""

    base: torch.Tensor  # [2, K, H]: side 0 filters the sublayer input, side 1 its output
    proj: torch.Tensor  # [2*K*G, H]: coef[r] = proj @ input[r], viewed [2, K, G]


@attrs.frozen
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    wq: torch.Tensor  # [nh*hd, H]
    wk: torch.Tensor  # [nkv*hd, H]
    wv: torch.Tensor  # [nkv*vd, H]
    wo: torch.Tensor  # [H, nh*vd]
    q_norm: torch.Tensor  # [hd]
    k_norm: torch.Tensor  # [hd]
    ffn_norm: torch.Tensor  # [H]
    w_gate: torch.Tensor  # [F, H]
    w_up: torch.Tensor  # [F, H]
    w_down: torch.Tensor  # [H, F]
    bq: torch.Tensor | None = None  # [nh*hd] optional attention biases (some converted drafters)
    bk: torch.Tensor | None = None
    bv: torch.Tensor | None = None
    bo: torch.Tensor | None = None
    attn_conv: ConvWeights | None = None
    ffn_conv: ConvWeights | None = None


@attrs.frozen
class DFlashWeights:
    fc: torch.Tensor  # [H, taps*H_target]
    enc_norm: torch.Tensor  # [H]
    out_norm: torch.Tensor  # [H]
    layers: tuple[LayerWeights, ...]
    selector: SelectorWeights | None = None
    draft_head: torch.Tensor | None = None  # [K, H] rows of cfg.draft_vocab (None: the target's head)


# GGUF name of each LayerWeights field, under blk.N.
LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight",
    "wk": "attn_k.weight",
    "wv": "attn_v.weight",
    "wo": "attn_output.weight",
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
    "ffn_norm": "ffn_norm.weight",
    "w_gate": "ffn_gate.weight",
    "w_up": "ffn_up.weight",
    "w_down": "ffn_down.weight",
}
LAYER_BIASES = {"bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "bo": "attn_output.bias"}
CONV_TENSORS = {"attn_conv": "attn_conv", "ffn_conv": "ffn_conv"}  # + _base / _proj
SELECTOR_TENSORS = {"hidden": "selector_hidden", "predecessor": "selector_predecessor", "successor": "selector_successor"}
GLOBAL_TENSORS = {"fc": "fc.weight", "enc_norm": "enc.output_norm.weight", "out_norm": "output_norm.weight"}
DRAFT_HEAD_TENSOR = "output.weight"


def expected_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a file with this config must carry, with its numpy shape."""
    H, F = cfg.hidden_size, cfg.ffn_size
    nh, nkv, hd, vd = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.value_dim
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (H, cfg.feature_size),
        "enc.output_norm.weight": (H,),
        "output_norm.weight": (H,),
    }
    per_layer = {
        "attn_norm.weight": (H,),
        "attn_q.weight": (nh * hd, H),
        "attn_k.weight": (nkv * hd, H),
        "attn_v.weight": (nkv * vd, H),
        "attn_output.weight": (H, nh * vd),
        "attn_q_norm.weight": (hd,),
        "attn_k_norm.weight": (hd,),
        "ffn_norm.weight": (H,),
        "ffn_gate.weight": (F, H),
        "ffn_up.weight": (F, H),
        "ffn_down.weight": (H, F),
    }
    if cfg.has_conv:
        K, G = int(cfg.conv_kernel_size), cfg.conv_groups
        for side in ("attn_conv", "ffn_conv"):
            per_layer[f"{side}_base.weight"] = (2, K, H)
            per_layer[f"{side}_proj.weight"] = (2 * K * G, H)
    for layer in range(cfg.num_layers):
        for name, shape in per_layer.items():
            shapes[f"blk.{layer}.{name}"] = shape
    if cfg.has_selector:
        r = int(cfg.selector_rank)
        shapes["selector_hidden.weight"] = (r, H)
        # the vocabulary is the target's: checked against it at attach time
    if cfg.draft_vocab is not None:
        shapes[DRAFT_HEAD_TENSOR] = (len(cfg.draft_vocab), H)
    return shapes


def tensor_names(cfg: DFlashConfig) -> list[str]:
    return list(expected_shapes(cfg))


def weights_from_gguf(gguf_file: Any, cfg: DFlashConfig, dtype: torch.dtype = torch.float32) -> DFlashWeights:
    """Load (dequantise) every tensor the config calls for; ModelLoadError on any gap."""
    path = gguf_file.path

    def resolve(name: str) -> str:
        if gguf_file.has_tensor(name):
            return name
        bare = name[: -len(".weight")] if name.endswith(".weight") else name + ".weight"
        if name.endswith(".weight") and _is_dflash2(name) and gguf_file.has_tensor(bare):
            return bare
        raise ModelLoadError(path, f"missing tensor {name!r} (the DFlash{'2' if _is_dflash2(name) else ''} "
                                   f"drafter described by its metadata needs it)")

    shapes = expected_shapes(cfg)
    loaded: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        stored = resolve(name)
        loaded[name] = gguf_file.require_tensor(stored, shape, dtype)

    def optional(name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        return gguf_file.require_tensor(name, shape, dtype) if gguf_file.has_tensor(name) else None

    layers = []
    for i in range(cfg.num_layers):
        fields = {f: loaded[f"blk.{i}.{n}"] for f, n in LAYER_TENSORS.items()}
        bias_shapes = {
            "bq": (cfg.n_head * cfg.head_dim,),
            "bk": (cfg.n_head_kv * cfg.head_dim,),
            "bv": (cfg.n_head_kv * cfg.value_dim,),
            "bo": (cfg.hidden_size,),
        }
        for f, n in LAYER_BIASES.items():
            fields[f] = optional(f"blk.{i}.{n}", bias_shapes[f])
        if cfg.has_conv:
            for f, n in CONV_TENSORS.items():
                fields[f] = ConvWeights(
                    base=loaded[f"blk.{i}.{n}_base.weight"], proj=loaded[f"blk.{i}.{n}_proj.weight"]
                )
        layers.append(LayerWeights(**fields))
    selector = None
    if cfg.has_selector:
        pred_name = resolve("selector_predecessor.weight")
        succ_name = resolve("selector_successor.weight")
        vocab_rows = gguf_file.tensor_shape(pred_name)[0]
        r = int(cfg.selector_rank)
        selector = SelectorWeights(
            hidden=loaded["selector_hidden.weight"],
            predecessor=gguf_file.require_tensor(pred_name, (vocab_rows, r), dtype),
            successor=gguf_file.require_tensor(succ_name, (vocab_rows, r), dtype),
            top_k=int(cfg.selector_top_k),
        )
    return DFlashWeights(
        fc=loaded["fc.weight"],
        enc_norm=loaded["enc.output_norm.weight"],
        out_norm=loaded["output_norm.weight"],
        layers=tuple(layers),
        selector=selector,
        draft_head=loaded.get(DRAFT_HEAD_TENSOR),
    )


def _is_dflash2(name: str) -> bool:
    return "_conv_" in name or name.startswith("selector_")


def map_weights(weights: DFlashWeights, fn: Callable[[torch.Tensor], torch.Tensor]) -> DFlashWeights:
    """A copy with ``fn`` applied to every tensor (dtype / device moves)."""

    def conv(c: ConvWeights | None) -> ConvWeights | None:
        return None if c is None else ConvWeights(base=fn(c.base), proj=fn(c.proj))

    def opt(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else fn(t)

    layers = []
    for lw in weights.layers:
        fields = {f: fn(getattr(lw, f)) for f in LAYER_TENSORS}
        fields.update({f: opt(getattr(lw, f)) for f in LAYER_BIASES})
        fields.update(attn_conv=conv(lw.attn_conv), ffn_conv=conv(lw.ffn_conv))
        layers.append(LayerWeights(**fields))
    sel = weights.selector
    if sel is not None:
        sel = SelectorWeights(
            hidden=fn(sel.hidden), predecessor=fn(sel.predecessor), successor=fn(sel.successor), top_k=sel.top_k
        )
    return DFlashWeights(
        fc=fn(weights.fc), enc_norm=fn(weights.enc_norm), out_norm=fn(weights.out_norm),
        layers=tuple(layers), selector=sel, draft_head=opt(weights.draft_head),
    )
