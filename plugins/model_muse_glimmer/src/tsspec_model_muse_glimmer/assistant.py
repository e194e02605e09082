"""The Muse-Glimmer DFlash assistant: three ways it reaches the target, one attach.

* ``--draft-model PATH`` (``--spec-draft-model``): the block plugin's ``dflash`` attach function
  binds a drafter file to any target with ``embed`` / ``lm_head`` / feature taps; nothing here.
* ``TS_MUSE_GLIMMER_DFLASH=PATH``: the loader attaches that drafter file right after loading.
* Carried in the target's own file: the drafter's keys (``dflash.*``, as in a drafter file) and
  its tensors under the prefix ``dflash.`` (``dflash.fc.weight``, ``dflash.blk.0.attn_q.weight``...).
  ``carry_drafter`` writes such a file; the loader reads it through ``CarriedDrafter``, a view
  that makes that part of the file look like a drafter file to the block plugin's reader.

Only one assistant is attached: an explicit ``--draft-model`` later replaces it (the runtime
attaches that after loading), and the environment's file outranks a carried one.

The DFlash drafter itself (and DFlash2's conv and selector) lives in the block plugin
(``tsspec-block``); without it a carried or named assistant is a clear load error.
"""

from __future__ import annotations

import os
from typing import Any

from tsspec.errors import ModelLoadError

ENV = "TS_MUSE_GLIMMER_DFLASH"
PREFIX = "dflash."  # the carried drafter's tensors; its keys are the drafter file's own
DRAFTER_ARCH = "dflash"
MASK_KEYS = ("tokenizer.ggml.mask_token_id",)


class CarriedDrafter:
    """The ``dflash`` part of a target GGUF, seen as a drafter file (the reader's interface)."""

    def __init__(self, gguf_file):
        self._file = gguf_file
        self.path = gguf_file.path
        self.architecture = DRAFTER_ARCH

    def arch_key(self, suffix: str) -> str:
        return f"{DRAFTER_ARCH}.{suffix}"

    def __contains__(self, key: str) -> bool:
        return key in self._file

    def get(self, key, *default):
        return self._file.get(key, *default)

    def require(self, key, kind=None):
        return self._file.require(key, kind)

    def has_tensor(self, name: str) -> bool:
        return self._file.has_tensor(PREFIX + name)

    def tensor_shape(self, name: str):
        return self._file.tensor_shape(PREFIX + name)

    def tensor(self, name: str, dtype=None):
        return self._file.tensor(PREFIX + name, dtype)

    def require_tensor(self, name: str, shape=None, dtype=None):
        return self._file.require_tensor(PREFIX + name, shape, dtype)


def carried_assistant(gguf_file) -> CarriedDrafter | None:
    """The drafter the target file carries, or None. The view stays valid only while the file
    is open, so the loader reads it (``read_carried``) before closing."""
    if not gguf_file.has_tensor(PREFIX + "fc.weight"):
        return None
    return read_carried(CarriedDrafter(gguf_file))


def _block():
    try:
        from tsspec_block import attach as block_attach
        from tsspec_block import config as block_config
        from tsspec_block import weights as block_weights
    except ImportError:
        return None
    return block_attach, block_config, block_weights


def read_carried(view: CarriedDrafter):
    """(config, float64 weights, float32 weights) of a carried drafter, read while open."""
    block = _block()
    if block is None:
        raise ModelLoadError(view.path, "the file carries a DFlash assistant, which needs the tsspec-block plugin")
    _, block_config, block_weights = block
    import torch

    cfg = block_config.config_from_gguf(view)
    return cfg, {dtype: block_weights.weights_from_gguf(view, cfg, dtype) for dtype in (torch.float32, torch.float64)}


def _bind(target, cfg, weights, path: str, options: Any) -> None:
    """Bind a drafter read elsewhere (the carried one) exactly as the block plugin's attach does."""
    block_attach, _, _ = _block()
    from tsspec_block.head import DFlashDraftHead

    block_attach.check_fit(cfg, target, path)
    dtype = block_attach._dtype(options, target)
    head = DFlashDraftHead(
        cfg, weights[dtype], target,
        use_conv=block_attach.extension_enabled(block_attach.CONV_ENV),
        use_selector=block_attach.extension_enabled(block_attach.SELECTOR_ENV),
        dtype=dtype, source=path,
    )
    target.spec_set_feature_taps(list(cfg.target_layers))
    if int(target.spec_feature_size) != cfg.feature_size:
        target.spec_set_feature_taps(None)
        raise ModelLoadError(path, f"the carried drafter reads {cfg.feature_size}-wide rows, the target gives "
                                   f"{target.spec_feature_size}")
    target.draft_head = head


def attach_at_load(target, carried, options: Any = None, environ=None) -> None:
    """Attach the environment's drafter file, else the carried one, else nothing."""
    path = (environ if environ is not None else os.environ).get(ENV, "").strip()
    if path:
        block = _block()
        if block is None:
            raise ModelLoadError(path, f"{ENV} names a DFlash assistant, which needs the tsspec-block plugin")
        if not os.path.isfile(path):
            raise ModelLoadError(path, f"{ENV} names no such file")
        block[0].attach_dflash(target, path, options)
        return
    if carried is not None:
        cfg, weights = carried
        _bind(target, cfg, weights, target.path or "<target>", options)


def carry_drafter(drafter_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, tensors) that carry a drafter file inside a target file: its ``dflash.*`` keys
    and mask-token key as they are, its tensors (float32) under ``dflash.``. Pass them to
    ``convert.write_muse_glimmer_gguf(extra_metadata=..., extra_tensors=...)``."""
    from tsspec.modeling.gguf_file import GGUFFile

    metadata: dict[str, Any] = {}
    tensors: dict[str, Any] = {}
    with GGUFFile(drafter_path) as gf:
        if gf.architecture != DRAFTER_ARCH:
            raise ModelLoadError(drafter_path, f"architecture {gf.architecture!r} is not {DRAFTER_ARCH!r}")
        for key in gf.keys:
            if key.startswith(DRAFTER_ARCH + ".") or key in MASK_KEYS:
                metadata[key] = gf.get(key)
        for name in gf.tensor_names:
            tensors[PREFIX + name] = gf.tensor(name).numpy()
    return metadata, tensors
