"""Loading a ``Qwen35Target`` from a GGUF file (the registered model loader) or from memory.

``load_qwen35(path, options)`` is what the model registry calls for the ``qwen35``, ``qwen35moe``
and ``qwen3next`` architectures. ``options`` is core's ``LoadOptions`` (device, dtype, and the
speculation options); ``dtype`` ``"float64"`` gives an (almost) batch-invariant model for exact
lossless tests, the default is float32. The rollback path comes from ``TS_Q35_VERIFY_SNAPSHOTS``
at load, or from ``options.speculation.extra["q35_verify_snapshots"]``.
"""

from __future__ import annotations

from typing import Any

import torch

from tsspec.errors import ModelLoadError

from .hparams import Qwen35HParams
from . import rowlinear
from .target import Qwen35Target, snapshots_enabled
from .weights import load_weights, move_weights

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64, "fp64": torch.float64,
          "float16": torch.float16, "bfloat16": torch.bfloat16}
SNAPSHOTS_OPTION = "q35_verify_snapshots"


def resolve_dtype(value: Any) -> torch.dtype:
    if value is None:
        return torch.float32
    if isinstance(value, torch.dtype):
        return value
    text = str(value).replace("torch.", "").lower()
    if text not in DTYPES:
        raise ValueError(f"dtype {value!r} is not supported (use {', '.join(sorted(DTYPES))})")
    return DTYPES[text]


def resolve_device(path: str, value: Any) -> torch.device:
    """``cpu`` or ``cuda[:N]`` where torch has CUDA; anything else is a ModelLoadError."""
    text = str(value or "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ModelLoadError(path, f"--device {text!r} is not a torch device") from None
    if device.type not in ("cpu", "cuda"):
        raise ModelLoadError(path, f"--device {text}: tsspec-model-qwen35 runs on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(path, f"--device {text}: torch has no CUDA device here")
    return device


def _snapshot_choice(options: Any) -> bool:
    extra = getattr(getattr(options, "speculation", None), "extra", None) or {}
    if SNAPSHOTS_OPTION in extra:
        return str(extra[SNAPSHOTS_OPTION]).strip().lower() not in {"0", "false", "no", "off"}
    return snapshots_enabled()


def load_from_source(source: Any, *, dtype: Any = None, tokenizer=None, per_row_snapshots: bool | None = None,
                     max_context: int | None = None, with_draft_head: bool = True, device: Any = "cpu",
                     kernels: dict | None = None, row_invariant: bool | None = None) -> Qwen35Target:
    """A target from an open ``GGUFFile`` or a ``MemorySource``, on ``device`` (its weights moved
    there), using the registered ``kernels`` ({op: callable}) for that device where present.
    ``row_invariant`` (default: wherever it can) runs a float32 CPU trunk's matrices and
    attention on the toolkit's row-invariant kernels, so verify rows equal one-row steps."""
    torch_dtype = resolve_dtype(dtype)
    hp = Qwen35HParams.from_gguf(source)
    weights = load_weights(source, hp, torch_dtype, with_nextn=with_draft_head)
    if torch.device(device).type != "cpu":
        weights = move_weights(weights, device)
    can = rowlinear.available(torch_dtype, device)
    if row_invariant and not can:
        raise ModelLoadError(getattr(source, "path", "<memory>"),
                             "row-invariant kernels need float32 on the CPU with the compiled kernels built")
    if can and row_invariant is not False:
        weights = rowlinear.row_invariant_weights(weights)
    return Qwen35Target(hp, weights, dtype=torch_dtype, tokenizer=tokenizer, per_row_snapshots=per_row_snapshots,
                        max_context=max_context, with_draft_head=with_draft_head,
                        source_path=getattr(source, "path", None), kernels=kernels)


def load_qwen35(gguf_path: str, options: Any = None) -> Qwen35Target:
    """The registered loader: ``loader(gguf_path, options) -> SpeculativeTarget``."""
    from tsspec_gguf.gguf_file import GGUFFile
    from tsspec_gguf.tokenizer import from_gguf as tokenizer_from_gguf

    device = resolve_device(gguf_path, getattr(options, "device", "cpu"))
    try:
        dtype = resolve_dtype(getattr(options, "dtype", None))
    except ValueError as exc:
        raise ModelLoadError(gguf_path, str(exc)) from None
    kernels = getattr(options, "kernels", None) or {}
    with GGUFFile(gguf_path) as gf:
        tokenizer = tokenizer_from_gguf(gf)
        return load_from_source(gf, dtype=dtype, tokenizer=tokenizer, per_row_snapshots=_snapshot_choice(options),
                                device=device, kernels=dict(kernels))
