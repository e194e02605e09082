"""The Muse-Glimmer DFlash assistant: three ways it reaches the target, one attach.

* ``--draft-model PATH`` (``--spec-draft-model``): the block plugin's ``dflash`` attach function
  binds a drafter file to any target with ``embed`` / ``lm_head`` / feature taps; nothing here.
* ``TS_MUSE_GLIMMER_DFLASH=PATH``: the loader attaches that drafter file right after loading.
* Carried in the target's own file: the drafter's keys (``dflash.*``, as in a drafter file) and
  its tensors under the prefix ``dflash.`` (``dflash.fc.weight``, ``dflash.blk.0.attn_q.weight``...).
  ``carry_drafter`` builds those keys and tensors; the loader reads them through ``CarriedDrafter``, a view
  that makes that part of the file look like a drafter file to the block plugin's reader.

Only one assistant is attached: an explicit ``--draft-model`` later replaces it (the runtime
attaches that after loading), and the environment's file outranks a carried one.

The DFlash drafter itself (and DFlash2's conv and selector) lives in whichever plugin registers
the ``dflash`` drafter architecture (``tsspec-block``); this plugin imports none: it hands the
file, or the carried part, to ``LoadOptions.attach_drafter_from``. Without such a plugin a
carried or named assistant is a clear load error.
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


def attach_at_load(target, gguf_file, options: Any = None, environ=None) -> None:
    """Attach the environment's drafter file, else the one ``gguf_file`` (the target's own file,
    still open) carries, else nothing."""
    path = (environ if environ is not None else os.environ).get(ENV, "").strip()
    carried = gguf_file.has_tensor(PREFIX + "fc.weight")
    if not path and not carried:
        return
    attach = getattr(options, "attach_drafter_from", None)
    if attach is None:  # called without tsspec's load options: the default plugins serve it
        from tsspec import LoadOptions

        attach = LoadOptions().attach_drafter_from
    if path and not os.path.isfile(path):
        raise ModelLoadError(path, f"{ENV} names no such file")
    attach(target, DRAFTER_ARCH, path or CarriedDrafter(gguf_file))


def carry_drafter(drafter_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, tensors) that carry a drafter file inside a target file: its ``dflash.*`` keys
    and mask-token key as they are, its tensors (float32) under ``dflash.``. Pass them to
    ``convert.write_muse_glimmer_gguf(extra_metadata=..., extra_tensors=...)``."""
    from tsspec_gguf.gguf_file import GGUFFile

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
