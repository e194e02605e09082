"""A speculators checkpoint read into a tsspec drafter GGUF (``tsspec convert SRC OUT.gguf``).

``dflash`` and ``dflash2`` become block drafter files (``dflash`` GGUF): their layers carry the
z-lab DFlash names the block plugin's converter already maps. A reduced draft vocabulary
(``lm_head.weight`` [K, H] with ``d2t``/``t2d``) becomes ``dflash.draft_vocab`` plus
``output.weight``; the two maps must agree. ``mtp`` becomes a NextN draft head file (``nextn``
GGUF, by the ``head_layouts`` table) that drafts with the target's own LM head. Every other type
fails with one line naming what tsspec lacks to run it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tsspec.errors import ModelLoadError

from .schema import BLOCK_TYPES, TYPE_KEY, unmapped_reason

__all__ = ["SpeculatorsFormatError", "read_config", "convert_speculators"]

VERIFIER_OWNED = ("embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight")


class SpeculatorsFormatError(ModelLoadError):
    """The checkpoint cannot become a tsspec drafter; the message names the source and the problem."""


def read_config(src_dir: str | Path) -> dict[str, Any]:
    path = Path(src_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpeculatorsFormatError(str(src_dir), f"config.json is unreadable ({exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get(TYPE_KEY), str):
        raise SpeculatorsFormatError(str(src_dir), f"config.json has no {TYPE_KEY}: not a speculators checkpoint")
    return config


def _draft_vocab(state: dict, vocab: int, fail) -> list[int]:
    """Target ids of the draft rows from ``d2t`` (row + offset), checked against ``t2d``."""
    d2t, t2d = state.pop("d2t", None), state.pop("t2d", None)
    if d2t is None or t2d is None:
        raise fail("a reduced draft vocabulary needs both d2t and t2d")
    offsets = d2t.to(dtype=__import__("torch").int64).numpy()  # [K]
    ids = np.arange(len(offsets), dtype=np.int64) + offsets  # [K] target ids
    if ids.min() < 0 or ids.max() >= vocab or len(set(ids.tolist())) != len(ids):
        raise fail("d2t maps draft rows outside the verifier's vocabulary or onto one token twice")
    mask = t2d.numpy().astype(bool)  # [V]
    if mask.shape[0] != vocab or not np.array_equal(np.flatnonzero(mask), np.sort(ids)):
        raise fail("d2t and t2d disagree on the draft vocabulary")
    return ids.tolist()


def _block_config(config: dict[str, Any], kind: str, fail) -> dict[str, Any]:
    """The z-lab style config the block converter reads, from the speculators fields."""
    layer = dict(config.get("transformer_layer_config") or {})
    if layer.get("model_type", "qwen3") != "qwen3":
        raise fail(f"draft layers of model_type {layer.get('model_type')!r}: the block drafter runs Qwen3 layers")
    if config.get("sample_from_anchor"):
        raise fail("sample_from_anchor=true: the block drafter anchors on the accepted token (block_size - 1 drafts)")
    sliding = [t == "sliding_attention" for t in layer.get("layer_types") or []]
    if any(sliding) and not config.get("sliding_window_non_causal", False):
        raise fail("causal sliding-window layers: the block drafter attends both ways inside a block")
    aux = config.get("aux_hidden_state_layer_ids")
    if not aux:
        raise fail("no aux_hidden_state_layer_ids")
    if config.get("mask_token_id") is None:
        raise fail("no mask_token_id")
    out = dict(layer)
    out["is_causal"] = False
    out["dflash_config"] = {
        # speculators' ids index hidden states (0: embeddings); HF target_layer_ids name outputs
        "target_layer_ids": [int(i) - 1 for i in aux],
        "mask_token_id": int(config["mask_token_id"]),
        "block_size": int(config.get("block_size") or 8),
    }
    if kind == "dflash2":
        for name in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            if config.get(name) is None:
                raise fail(f"a dflash2 checkpoint without {name}")
            out["dflash_config"][name] = int(config[name])
    return out


def convert_speculators(src_dir: Path, out_path: Path, *, outtype: str = "f32") -> str:
    """Write the drafter GGUF for a speculators checkpoint; returns its speculators type."""
    from tsspec_block.converter import gguf_metadata, gguf_tensors, load_checkpoint, write_gguf, ZLAB

    source = str(src_dir)

    def fail(problem: str) -> SpeculatorsFormatError:
        return SpeculatorsFormatError(source, problem)

    config = read_config(src_dir)
    kind = config[TYPE_KEY]
    from .head_layouts import LAYOUTS

    if kind in LAYOUTS:
        return convert_head(src_dir, out_path, config, LAYOUTS[kind], outtype=outtype)
    if kind not in BLOCK_TYPES:
        raise fail(unmapped_reason(kind))
    if outtype not in ("f32", "f16"):
        raise fail(f"outtype {outtype!r}: block drafter files are written f32 or f16")
    hf_config = _block_config(config, kind, fail)
    state, _ = load_checkpoint(src_dir)
    for name in VERIFIER_OWNED:
        state.pop(name, None)
    vocab = int(hf_config.get("vocab_size") or 0)
    draft_size = int(config.get("draft_vocab_size") or vocab)
    head = state.pop("lm_head.weight", None)
    draft_ids = None
    if draft_size != vocab:
        if head is None:
            raise fail("a reduced draft vocabulary without lm_head.weight")
        draft_ids = _draft_vocab(state, vocab, fail)
        if tuple(head.shape)[0] != len(draft_ids):
            raise fail(f"lm_head.weight has {tuple(head.shape)[0]} rows for {len(draft_ids)} draft tokens")
    else:
        state.pop("d2t", None), state.pop("t2d", None)  # identity maps mean nothing (the format ignores them)
        # a full-vocabulary head is the verifier's; the block drafter borrows the target's
    tensors = gguf_tensors(state, ZLAB, fail)
    fc_in = int(tensors["fc.weight"].shape[1])
    meta = gguf_metadata(hf_config, fc_in, ZLAB, fail)
    if draft_ids is not None:
        meta["draft_vocab"] = [int(i) for i in draft_ids]
        tensors["output.weight"] = head.detach().float().numpy()
    write_gguf(out_path, meta, tensors, out_type=outtype, name=f"speculators {kind}")
    return kind


def _head_settings(config: dict[str, Any], layout, fail) -> dict[str, Any]:
    """The NextN head's shape from a speculators head config; refusals name the piece."""
    from tsspec_draft_head.nextn_model import NextNConfig

    from .head_layouts import GGUF_ARCHITECTURES

    layer = dict(config.get("transformer_layer_config") or {})
    if layer.get("model_type") != "qwen3":
        raise fail(f"an {layout.kind} layer of model_type {layer.get('model_type')!r}: tsspec's NextN head runs "
                   "a Qwen3 layer (no gated attention, no linear attention)")
    if int(config.get("num_nextn_predict_layers", 1)) != 1:
        raise fail("more than one MTP layer: tsspec's NextN head chains one")
    if layer.get("attention_bias") or layer.get("mlp_bias"):
        raise fail("attention or MLP biases: tsspec's NextN head has none")
    if layer.get("hidden_act", "silu") != "silu":
        raise fail(f"activation {layer.get('hidden_act')!r}: tsspec's NextN head runs SwiGLU (silu)")
    if layer.get("use_sliding_window"):
        raise fail("a sliding-window layer: tsspec's NextN head attends to its whole context")
    rope = dict(layer.get("rope_parameters") or {})
    if rope.get("rope_type", "default") != "default":
        raise fail(f"RoPE scaling {rope.get('rope_type')!r}: tsspec's NextN head turns plain RoPE")
    theta = rope.get("rope_theta", layer.get("rope_theta", 10000.0))
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    names = [a for a in verifier.get("architectures") or [] if a in GGUF_ARCHITECTURES]
    if not names:
        raise fail(f"verifier architectures {verifier.get('architectures')!r}: tsspec knows none of them "
                   f"({', '.join(GGUF_ARCHITECTURES)})")
    try:
        heads = int(layer["num_attention_heads"])
        hidden = int(layer["hidden_size"])
        cfg = NextNConfig(
            hidden_size=hidden, intermediate_size=int(layer["intermediate_size"]), num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads), rope_theta=float(theta),
            rms_eps=float(layer.get("rms_norm_eps", 1e-6)), qk_norm=True, shared_head=True,
        )
        vocab = int(layer["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise fail(f"transformer_layer_config lacks {exc}") from None
    if int(config.get("draft_vocab_size") or vocab) != vocab:
        raise fail(f"a draft vocabulary in an {layout.kind} checkpoint: its head is the verifier's")
    return {"cfg": cfg, "vocab": vocab, "architecture": GGUF_ARCHITECTURES[names[0]], "verifier": verifier}


def convert_head(src_dir, out_path, config: dict[str, Any], layout, *, outtype: str = "f32") -> str:
    """A speculators draft-head checkpoint (``layout``) as a ``nextn`` GGUF."""
    import torch

    from tsspec_block.converter import load_checkpoint
    from tsspec_draft_head.nextn_file import OUTTYPES, write_nextn
    from tsspec_draft_head.nextn_model import NextNModule

    from .head_layouts import from_hf

    source = str(src_dir)

    def fail(problem: str) -> SpeculatorsFormatError:
        return SpeculatorsFormatError(source, problem)

    if outtype not in OUTTYPES:
        raise fail(f"outtype {outtype!r}: draft head files are written {', '.join(OUTTYPES)}")
    shape = _head_settings(config, layout, fail)
    cfg = shape["cfg"]
    state, _ = load_checkpoint(src_dir)
    for name in layout.verifier_owned:
        state.pop(name, None)
    module = NextNModule(cfg, shape["vocab"])
    with torch.no_grad():
        for param, hf in layout.tensors.items():
            tensor = state.pop(layout.prefix + hf, None)
            if tensor is None:
                raise fail(f"no tensor {layout.prefix + hf}")
            want = tuple(getattr(module, param).shape)
            if tuple(tensor.shape) != want:
                raise fail(f"{layout.prefix + hf} has shape {tuple(tensor.shape)}, the config says {want}")
            array = tensor.detach().float().numpy()
            if param in layout.rope_rows:
                array = from_hf(array, cfg.head_dim)
            getattr(module, param).copy_(torch.from_numpy(array))
    for name in ("d2t", "t2d"):
        state.pop(name, None)  # identity maps over the full vocabulary mean nothing
    if state:
        raise fail(f"tensor {sorted(state)[0]!r} has no place in tsspec's NextN head")
    verifier = shape["verifier"]
    target = {"architecture": shape["architecture"], "vocab_size": shape["vocab"],
              "name": verifier.get("name_or_path") or shape["architecture"]}
    manifest = {"source": f"speculators {layout.kind} checkpoint", "verifier": verifier.get("name_or_path")}
    write_nextn(out_path, module, target=target, manifest=manifest, outtype=outtype)
    return layout.kind
