"""Attaching a DFlash drafter file to a target: read, check the fit, bind, set the feature taps.

``attach_dflash(target, path, options)`` is what the plugin registers for the ``dflash`` and
``dflash-draft`` architectures (``--draft-model PATH``). Everything that can be wrong with the
pair is found HERE, before the first token: a ``ModelLoadError`` naming the file and the
mismatch (the CLI prints it as one line; the block speculator's factory turns it into a decline
reason), never a crash mid-generation. The target is left untouched when attaching fails.

A file with ``dflash.hyper_connection.count > 0`` is a DSpark drafter for a hyper-connection
model (DeepSeek V4): its stages are that model's blocks, so the target binds it itself
(``target.attach_drafter_file(path, options)``, offered by the model plugin).

A target that already carries a per-token head (NextN / MTP) gets its ``draft_head`` replaced:
the operator named the file, and the two consume different hidden rows.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import torch

from tsspec.errors import ModelLoadError
from tsspec.switches import switch_on

from .config import DFlashConfig, config_from_gguf
from .head import DFlashDraftHead
from .weights import weights_from_gguf

__all__ = ["attach_dflash", "attach_open", "check_fit", "CONV_ENV", "SELECTOR_ENV", "extension_enabled"]

log = logging.getLogger("tsspec.block")

CONV_ENV = "TS_DFLASH_CONV"  # "0": run a DFlash2 file without its convolution (attribution)
SELECTOR_ENV = "TS_DFLASH_SELECTOR"  # "0": plain argmax instead of the selector lattice
TARGET_SURFACE = ("embed", "lm_head", "spec_set_feature_taps")
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64, "fp64": torch.float64}


def extension_enabled(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """A DFlash2 extension is on unless its switch is set to 0 / false / no / off."""
    return switch_on(name, environ)


def check_fit(cfg: DFlashConfig, target: Any, path: str) -> None:
    """Raise ModelLoadError when the drafter cannot serve ``target``; the message says why."""
    missing = [name for name in TARGET_SURFACE if not callable(getattr(target, name, None))]
    if missing:
        arch = getattr(getattr(target, "config", None), "architecture", type(target).__name__)
        raise ModelLoadError(
            path, f"the target ({arch}) does not expose {', '.join(missing)}, which a DFlash drafter borrows"
        )
    tcfg = target.config
    hidden, vocab, layers = int(tcfg.hidden_size), int(tcfg.vocab_size), int(tcfg.num_layers)
    if cfg.target_hidden_size != hidden:
        raise ModelLoadError(
            path, f"drafter target_hidden_size is {cfg.target_hidden_size} but the target's hidden size is "
            f"{hidden}: this drafter was trained for another model"
        )
    if cfg.hidden_size != hidden:
        raise ModelLoadError(
            path, f"drafter width {cfg.hidden_size} differs from the target's hidden size {hidden}; a DFlash "
            "drafter borrows the target's embedding and LM head, so they must match"
        )
    bad = [layer for layer in cfg.target_layers if not 0 <= layer <= layers]
    if bad:
        raise ModelLoadError(
            path, f"dflash.target_layers {list(cfg.target_layers)} reach layer {bad[0]}, but the target has "
            f"{layers} layers (taps 0..{layers} name the residual entering a layer)"
        )
    if cfg.vocab_size is not None and cfg.vocab_size != vocab:
        raise ModelLoadError(
            path, f"drafter vocabulary ({cfg.vocab_size} tokens) does not match the target's ({vocab})"
        )
    if cfg.draft_vocab is not None and max(cfg.draft_vocab) >= vocab:
        raise ModelLoadError(
            path, f"dflash.draft_vocab names token {max(cfg.draft_vocab)}, outside the target's vocabulary of "
            f"{vocab} tokens"
        )
    if cfg.mask_token_id >= vocab:
        raise ModelLoadError(
            path, f"mask token id {cfg.mask_token_id} is outside the target's vocabulary of {vocab} tokens"
        )


def _dtype(options: Any, target: Any) -> torch.dtype:
    """The drafter's compute dtype: the operator's, else the target's (float32 at least)."""
    name = getattr(options, "dtype", None) if options is not None else None
    if isinstance(name, str) and name.lower() in _DTYPES:
        return _DTYPES[name.lower()]
    probe = target.embed([0])
    return torch.float64 if probe.dtype == torch.float64 else torch.float32


def attach_dflash(target: Any, gguf_path: str, options: Any = None) -> DFlashDraftHead:
    """Read ``gguf_path``, check it against ``target``, bind it and make it ``target.draft_head``."""
    from tsspec_gguf.gguf_file import GGUFFile

    path = str(gguf_path)
    with GGUFFile(path) as gguf_file:
        hyper = int(gguf_file.get(f"{gguf_file.architecture}.hyper_connection.count", 0) or 0)
        if hyper <= 0:
            return attach_open(target, gguf_file, options)
    # a DSpark drafter for a hyper-connection model (DeepSeek V4) in the dflash convention: its
    # stages are the model's own blocks, so the model plugin binds it
    bind = getattr(target, "attach_drafter_file", None)
    if not callable(bind):
        arch = getattr(getattr(target, "config", None), "architecture", type(target).__name__)
        raise ModelLoadError(path, f"a DFlash file with hyper_connection.count = {hyper} drafts for a "
                                   f"hyper-connection model (DeepSeek V4 DSpark); the target ({arch}) cannot bind it")
    return bind(path, options)


def attach_open(target: Any, gguf_file: Any, options: Any = None) -> DFlashDraftHead:
    """``attach_dflash`` on an open ``GGUFFile``, or on any object with its reading methods (a
    model plugin whose target file carries the drafter passes a view of that part)."""
    path = str(gguf_file.path)
    cfg = config_from_gguf(gguf_file)
    check_fit(cfg, target, path)
    dtype = _dtype(options, target)
    weights = weights_from_gguf(gguf_file, cfg, dtype)
    vocab = int(target.config.vocab_size)
    if weights.selector is not None and weights.selector.vocab_size != vocab:
        raise ModelLoadError(
            path, f"the selector codebooks cover {weights.selector.vocab_size} tokens but the target's "
            f"vocabulary has {vocab}: this drafter was trained for another model"
        )
    head = DFlashDraftHead(
        cfg,
        weights,
        target,
        use_conv=extension_enabled(CONV_ENV),
        use_selector=extension_enabled(SELECTOR_ENV),
        dtype=dtype,
        source=path,
        kernels=getattr(options, "kernels", None) if options is not None else None,
    )
    previous = getattr(target, "draft_head", None)
    try:
        target.spec_set_feature_taps(list(cfg.target_layers))
    except (ValueError, TypeError, IndexError) as exc:
        raise ModelLoadError(path, f"the target refused feature taps {list(cfg.target_layers)}: {exc}") from None
    width = int(target.spec_feature_size)
    if width != cfg.feature_size:
        target.spec_set_feature_taps(None)
        raise ModelLoadError(
            path, f"with taps set the target's hidden rows are {width} wide, the drafter reads {cfg.feature_size}"
        )
    if previous is not None:
        log.info("attaching %s replaces the target's %s draft head", path, getattr(previous.kind, "value", "?"))
    target.draft_head = head
    return head
