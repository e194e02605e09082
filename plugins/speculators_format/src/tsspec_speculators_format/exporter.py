"""tsspec drafters written as speculators checkpoints: block drafters and draft heads.

``export_head(gguf_path, out_dir)`` writes a NextN draft head (GGUF ``nextn``) as the type
whose table (``head_layouts``) it fits: ``config.json`` plus the layer's tensors under their
Hugging Face names; the verifier's embedding and LM head are not written (the format reloads
them). A head lacking a piece of every type's equations is refused in one line naming it.

A tsspec block drafter (GGUF ``dflash``) written as a speculators checkpoint:

``export_block(gguf_path, out_dir)`` writes ``config.json`` (``speculators_model_type`` ``dflash``
or ``dflash2``) and ``model.safetensors``: the draft layers under their Hugging Face names, a
draft vocabulary as ``lm_head.weight`` [K, H] with ``d2t``/``t2d`` (rows in target-id order, as
the format's mask implies). The target's embedding and LM head are not written: the format
reloads them from the verifier. Whatever the format cannot say is a ``ExportError`` line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tsspec.errors import TsspecError

from .schema import ARCHITECTURES, SPECULATORS_VERSION, TYPE_KEY, speculators_config

__all__ = ["ExportError", "export_block", "export_head", "read_gguf_tensors"]


class ExportError(TsspecError):
    """The drafter cannot be written in the speculators format; one line, exit code 2."""


def read_gguf_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF as float32 numpy (numpy order), dequantized where stored packed."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = np.asarray(t.data, dtype=np.float32)
        else:
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        out[t.name] = data.reshape(shape)
    return out


def _layer_names() -> dict[str, str]:
    from tsspec_block.converter import LAYER_MAP

    return {gguf_name: hf_name for hf_name, gguf_name in LAYER_MAP.items()}


def _transformer_config(cfg, vocab_size: int) -> dict[str, Any]:
    """The draft layers as a Qwen3 config (the layer type of speculators' DFlash family)."""
    out: dict[str, Any] = {
        "model_type": "qwen3",
        "vocab_size": int(vocab_size),
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.ffn_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head_kv,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": float(cfg.eps),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(cfg.rope_base)},
        "attention_bias": False,
        "tie_word_embeddings": False,
    }
    if cfg.sliding_window:
        sliding = cfg.sliding_layers or (True,) * cfg.num_layers
        out["sliding_window"] = int(cfg.sliding_window)
        out["use_sliding_window"] = True
        out["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
    else:
        out["layer_types"] = ["full_attention"] * cfg.num_layers
    return out


def export_block(gguf_path: str | Path, out_dir: str | Path, *, vocab_size: int | None = None,
                 verifier: str | None = None, verifier_architectures: list[str] | None = None) -> dict[str, Any]:
    """Write the ``dflash`` GGUF at ``gguf_path`` as a speculators checkpoint in ``out_dir``;
    returns the config written. ``vocab_size``: the target's, where the file states none."""
    import torch
    from safetensors.torch import save_file

    from tsspec_gguf.gguf_file import GGUFFile
    from tsspec_block.config import config_from_gguf

    src = str(gguf_path)

    def fail(problem: str) -> ExportError:
        return ExportError(f"{src}: {problem}")

    try:
        with GGUFFile(src) as gf:
            cfg = config_from_gguf(gf)
    except TsspecError:
        raise
    except Exception as exc:  # not a GGUF, not a dflash file: one line
        raise fail(f"not a block drafter file ({exc})") from None
    if cfg.logit_scale != 1.0 or cfg.logit_softcap:
        raise fail("the speculators format has no field for the target's logit scale / softcap this drafter uses")
    if cfg.value_dim != cfg.head_dim:
        raise fail("the speculators DFlash layer has no separate value width (attention.value_length)")
    kind = "dflash2" if cfg.conv_kernel_size or cfg.selector_rank else "dflash"
    if kind == "dflash2" and not (cfg.conv_kernel_size and cfg.selector_rank):
        raise fail("speculators' dflash2 needs both the grouped conv and the candidate selector; this file has one")
    vocab = cfg.vocab_size or vocab_size
    if not vocab:
        raise fail("the file states no vocabulary size: pass the target's (--vocab-size)")
    tensors = read_gguf_tensors(src)
    names = _layer_names()
    from tsspec_block.converter import GLOBAL_MAP, SELECTOR_MAP, ZLAB

    globals_back = {g: h for h, g in GLOBAL_MAP[ZLAB].items()}
    # the selector's projection is a Linear (".weight"); its codebooks are bare parameters
    selector_back = {g: h + ".weight" if h.endswith("projection") else h for h, g in SELECTOR_MAP.items()}
    state: dict[str, torch.Tensor] = {}
    for name, array in tensors.items():
        if name in globals_back:
            hf = globals_back[name]
        elif name in selector_back:
            hf = selector_back[name]
        elif name == "output.weight":
            continue  # the draft vocabulary's rows, below
        elif name.startswith("blk.") and name.split(".", 2)[2] in names:
            _, layer, rest = name.split(".", 2)
            hf = f"layers.{layer}.{names[rest]}"
        else:
            raise fail(f"tensor {name!r} has no place in a speculators {kind} checkpoint")
        if hf.endswith(".bias"):
            raise fail(f"tensor {name!r}: speculators' DFlash layer has no attention biases")
        state[hf] = torch.from_numpy(np.array(array, dtype=np.float32))  # a writable copy
    for layer in range(cfg.num_layers):
        for need in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
            if f"layers.{layer}.{need}" not in state:
                raise fail(f"layer {layer} has no {need.split('.')[1]}: speculators' DFlash layer is a Qwen3 layer")
    draft_vocab = len(cfg.draft_vocab) if cfg.draft_vocab else int(vocab)
    if cfg.draft_vocab:
        ids = np.asarray(cfg.draft_vocab, dtype=np.int64)  # [K] target id of each file row
        order = np.argsort(ids, kind="stable")  # the format's rows run in target-id order
        rows = tensors["output.weight"][order]  # [K, H]
        sorted_ids = ids[order]
        state["lm_head.weight"] = torch.from_numpy(np.ascontiguousarray(rows))
        state["d2t"] = torch.from_numpy(sorted_ids - np.arange(len(sorted_ids), dtype=np.int64))  # [K]
        mask = torch.zeros(int(vocab), dtype=torch.bool)  # [V]
        mask[torch.from_numpy(sorted_ids)] = True
        state["t2d"] = mask
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[kind]],
        TYPE_KEY: kind,
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": _transformer_config(cfg, vocab),
        "draft_vocab_size": draft_vocab,
        "block_size": cfg.block_size,
        "target_hidden_size": cfg.target_hidden_size,
        # GGUF target_layers name the residual entering a layer: speculators' hidden-state index
        "aux_hidden_state_layer_ids": [int(i) for i in cfg.target_layers],
        "mask_token_id": cfg.mask_token_id,
        "sliding_window_non_causal": True,  # tsspec's blocks attend both ways inside the block
        "sample_from_anchor": False,  # the anchor is the last accepted token: block_size - 1 drafts
        "speculators_config": speculators_config(kind, cfg.block_size - 1, verifier, verifier_architectures or []),
    }
    if kind == "dflash2":
        config.update(conv_kernel_size=cfg.conv_kernel_size, conv_group_size=cfg.conv_group_size,
                      selector_rank=cfg.selector_rank, selector_top_k=cfg.selector_top_k)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return config


def _head_config(layout, cfg, vocab: int, verifier_layers: int) -> dict[str, Any]:
    """The head's layer as the Qwen3 config speculators' mtp layer is built from."""
    return {
        "model_type": "qwen3",
        "vocab_size": int(vocab),
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        # speculators reads the verifier hidden state at index num_hidden_layers (its last)
        "num_hidden_layers": int(verifier_layers),
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(cfg.rms_eps),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(cfg.rope_theta)},
        "attention_bias": False,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
    }


def export_head(gguf_path: str | Path, out_dir: str | Path, *, kind: str | None = None,
                verifier: str | None = None, verifier_architectures: list[str] | None = None,
                verifier_layers: int | None = None, speculative_tokens: int | None = None) -> dict[str, Any]:
    """Write the ``nextn`` draft head at ``gguf_path`` as a speculators checkpoint of ``kind``
    (None: the first type whose equations it fits); returns the config written."""
    import torch
    from safetensors.torch import save_file

    from tsspec.errors import ModelLoadError
    from tsspec_draft_head.nextn_file import read_nextn

    from .head_layouts import EAGLE3_GAP, GGUF_ARCHITECTURES, LAYOUTS, to_hf

    src = str(gguf_path)

    def fail(problem: str) -> ExportError:
        return ExportError(f"{src}: {problem}")

    try:
        module, facts, _ = read_nextn(src)
    except ModelLoadError as exc:
        raise ExportError(str(exc)) from None
    cfg = module.cfg
    if kind is not None and kind not in LAYOUTS:
        raise fail(f"speculators type {kind!r} takes no tsspec draft head (it exports to {', '.join(LAYOUTS)})")
    candidates = [LAYOUTS[kind]] if kind else list(LAYOUTS.values())
    fits = [layout for layout in candidates if not layout.missing(cfg)]
    if not fits:
        why = "; ".join([f"{layout.kind} needs {' and '.join(layout.missing(cfg))}" for layout in candidates]
                        + ([EAGLE3_GAP] if kind is None else []))
        raise fail(f"no speculators type drafts the way this head does: {why}")
    layout = fits[0]
    if not verifier_layers or verifier_layers < 1:
        raise fail(f"speculators' {layout.kind} names the verifier hidden state it reads by the verifier's layer "
                   "count: pass --verifier-layers")
    state: dict[str, torch.Tensor] = {}
    for param, hf in layout.tensors.items():
        array = getattr(module, param).detach().float().numpy()  # [rows, cols] or [n]
        if param in layout.rope_rows:
            array = to_hf(array, cfg.head_dim)
        state[layout.prefix + hf] = torch.from_numpy(np.array(array, dtype=np.float32))
    steps = int(speculative_tokens or (module_recommended(facts) or 3))
    if not verifier_architectures:  # the architecture the head was trained on, by its HF name
        verifier_architectures = [hf for hf, arch in GGUF_ARCHITECTURES.items() if arch == facts["architecture"]][:1]
    config: dict[str, Any] = {
        "architectures": [layout.architecture],
        TYPE_KEY: layout.kind,
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": _head_config(layout, cfg, facts["vocab_size"], verifier_layers),
        "num_nextn_predict_layers": 1,
        "speculators_config": speculators_config(layout.kind, steps, verifier, verifier_architectures or []),
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return config


def module_recommended(facts: dict[str, Any]) -> int | None:
    """The chain length the drafter file recommends (None: it recommends none)."""
    return (facts.get("recommended") or {}).get("draft_max")
