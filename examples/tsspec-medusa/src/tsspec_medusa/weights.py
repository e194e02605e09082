"""The Medusa heads GGUF: its layout, a reader, writers, and a converter from the original
Medusa checkpoint layout.

Layout (all sizes are uint32 metadata; tensors are F32 or F16, or any type tsspec dequantises)::

    general.architecture      = "medusa"
    medusa.head_count         K   heads; head k predicts the token k+2 after the hidden row's
    medusa.layers_per_head    L   residual blocks per head (0 allowed)
    medusa.embedding_length   H   the target's hidden size
    medusa.vocab_size         V   the target's vocabulary size
    medusa.{k}.res.{j}.weight [H, H]  block j of head k ([out, in], numpy order)
    medusa.{k}.res.{j}.bias   [H]
    medusa.{k}.out.weight     [V, H]  head k's vocabulary projection

Reading and writing use the ``gguf`` package (``GGUFReader``, ``GGUFWriter``; quantised tensors
dequantise through ``gguf.quants``). Every problem with a file surfaces as a
``MedusaFileError`` (a ``tsspec.TsspecError``) naming the path, which the CLI prints as one line.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

import gguf

import tsspec

from .heads import MedusaHeads

__all__ = [
    "ARCHITECTURE",
    "MedusaFileError",
    "MedusaFileInfo",
    "read_medusa_info",
    "read_medusa",
    "write_medusa",
    "write_random_medusa",
    "heads_from_medusa_state_dict",
]

ARCHITECTURE = "medusa"
KEY_HEAD_COUNT = "medusa.head_count"
KEY_LAYERS = "medusa.layers_per_head"
KEY_HIDDEN = "medusa.embedding_length"
KEY_VOCAB = "medusa.vocab_size"
DEFAULT_HEADS = 3  # enough to show chaining; Medusa papers train 3-5
DEFAULT_LAYERS = 1  # the original Medusa-1 default
# random weights: residual matrices scaled like a small init, projections like an lm_head
RANDOM_RES_SCALE = 0.5
RANDOM_OUT_SCALE = 4.0


class MedusaFileError(tsspec.TsspecError):
    """A Medusa file that cannot be read: ``"<path>: <problem>"``, one line."""

    def __init__(self, path: object, problem: str):
        super().__init__(f"{path}: {problem}")


class _File:
    """The few reads a Medusa file needs, over ``gguf.GGUFReader``."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = str(path)
        if not os.path.isfile(self.path):
            raise MedusaFileError(self.path, "no such file")
        try:
            self._reader = gguf.GGUFReader(self.path)
        except Exception as exc:  # the library's own message for a file that is not a GGUF
            raise MedusaFileError(self.path, f"not a readable GGUF file ({type(exc).__name__}: {exc})") from None
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.architecture = self.get("general.architecture", None)

    def get(self, key: str, default=None):
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str, kind=int):
        value = self.get(key)
        if not isinstance(value, kind):
            raise MedusaFileError(self.path, f"metadata key {key!r} is missing or not {kind.__name__}")
        return value

    def check_tensor(self, name: str, shape: tuple[int, ...]) -> None:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise MedusaFileError(self.path, f"tensor {name!r} is missing")
        have = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims fastest first
        if have != shape:
            raise MedusaFileError(self.path, f"tensor {name!r} has shape {list(have)}, expected {list(shape)}")

    def tensor(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        t = self._tensors[name]
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape))
        return torch.tensor(np.asarray(data, dtype=np.float32).reshape(shape), dtype=dtype)  # a copy


def res_weight_name(k: int, j: int) -> str:
    return f"medusa.{k}.res.{j}.weight"


def res_bias_name(k: int, j: int) -> str:
    return f"medusa.{k}.res.{j}.bias"


def out_weight_name(k: int) -> str:
    return f"medusa.{k}.out.weight"


@dataclasses.dataclass(frozen=True)
class MedusaFileInfo:
    """What a Medusa file declares, checked against its tensors (no tensor bytes read)."""

    path: str
    head_count: int
    layers_per_head: int
    hidden_size: int
    vocab_size: int
    name: str | None = None


def _size(gf, key: str, minimum: int) -> int:
    value = gf.require(key, int)
    if value < minimum:
        raise MedusaFileError(gf.path, f"metadata key {key!r} must be >= {minimum}, got {value}")
    return int(value)


def _read_info(gf) -> MedusaFileInfo:
    arch = gf.architecture
    if arch != ARCHITECTURE:
        raise MedusaFileError(
            gf.path, f"general.architecture is {arch!r}, not {ARCHITECTURE!r}: not a Medusa heads file"
        )
    k = _size(gf, KEY_HEAD_COUNT, 1)
    layers = _size(gf, KEY_LAYERS, 0)
    hidden = _size(gf, KEY_HIDDEN, 1)
    vocab = _size(gf, KEY_VOCAB, 1)
    for head in range(k):
        for j in range(layers):
            gf.check_tensor(res_weight_name(head, j), (hidden, hidden))
            gf.check_tensor(res_bias_name(head, j), (hidden,))
        gf.check_tensor(out_weight_name(head), (vocab, hidden))
    return MedusaFileInfo(gf.path, k, layers, hidden, vocab, gf.get("general.name", None))


def read_medusa_info(path: str | os.PathLike[str]) -> MedusaFileInfo:
    """The sizes a Medusa file declares, after checking every tensor is there with its shape.

    Cheap (header only): the drafter hook runs it when the file is attached."""
    return _read_info(_File(path))


def read_medusa(path: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> MedusaHeads:
    """Load a Medusa file's weights (dequantised to ``dtype``, on the CPU)."""
    gf = _File(path)
    info = _read_info(gf)
    k, layers, hidden = info.head_count, info.layers_per_head, info.hidden_size
    res_w = torch.empty(k, layers, hidden, hidden, dtype=dtype)  # [K, L, H, H]
    res_b = torch.empty(k, layers, hidden, dtype=dtype)  # [K, L, H]
    out_w = torch.empty(k, info.vocab_size, hidden, dtype=dtype)  # [K, V, H]
    for head in range(k):
        for j in range(layers):
            res_w[head, j] = gf.tensor(res_weight_name(head, j), dtype)
            res_b[head, j] = gf.tensor(res_bias_name(head, j), dtype)
        out_w[head] = gf.tensor(out_weight_name(head), dtype)
    return MedusaHeads(res_w, res_b, out_w)


def _as_numpy(t, dtype) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach().to("cpu", torch.float32).numpy()
    return np.ascontiguousarray(np.asarray(t, dtype=np.float32).astype(dtype))


def write_medusa(
    path: str | os.PathLike[str],
    res_weight,
    res_bias,
    out_weight,
    *,
    name: str | None = None,
    float16: bool = False,
) -> Path:
    """Write heads to a Medusa GGUF. Arrays (numpy or torch) in the ``MedusaHeads`` layout:
    res_weight [K, L, H, H], res_bias [K, L, H], out_weight [K, V, H]."""
    heads = MedusaHeads(torch.as_tensor(np.asarray(res_weight, dtype=np.float32)),
                        torch.as_tensor(np.asarray(res_bias, dtype=np.float32)),
                        torch.as_tensor(np.asarray(out_weight, dtype=np.float32)))  # validates shapes
    dtype = np.float16 if float16 else np.float32
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), ARCHITECTURE)
    if name:
        writer.add_name(name)
    writer.add_uint32(KEY_HEAD_COUNT, heads.head_count)
    writer.add_uint32(KEY_LAYERS, heads.layers_per_head)
    writer.add_uint32(KEY_HIDDEN, heads.hidden_size)
    writer.add_uint32(KEY_VOCAB, heads.vocab_size)
    for k in range(heads.head_count):
        for j in range(heads.layers_per_head):
            writer.add_tensor(res_weight_name(k, j), _as_numpy(heads.res_weight[k, j], dtype))
            # biases stay F32: they are tiny, and ggml keeps 1-D tensors in F32
            writer.add_tensor(res_bias_name(k, j), _as_numpy(heads.res_bias[k, j], np.float32))
        writer.add_tensor(out_weight_name(k), _as_numpy(heads.out_weight[k], dtype))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path


def write_random_medusa(
    path: str | os.PathLike[str],
    hidden_size: int,
    vocab_size: int,
    heads: int = DEFAULT_HEADS,
    *,
    layers: int = DEFAULT_LAYERS,
    seed: int = 0,
) -> Path:
    """A Medusa file with seeded random weights for a target of the given sizes.

    Its drafts are almost always rejected: it exists to exercise the plumbing (attach, decline,
    lossless output), not to speed anything up."""
    if hidden_size < 1 or vocab_size < 1 or heads < 1 or layers < 0:
        raise ValueError("hidden_size, vocab_size and heads must be >= 1, layers >= 0")
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(hidden_size)
    res_w = rng.standard_normal((heads, layers, hidden_size, hidden_size)) * scale * RANDOM_RES_SCALE
    res_b = rng.standard_normal((heads, layers, hidden_size)) * 0.1
    out_w = rng.standard_normal((heads, vocab_size, hidden_size)) * scale * RANDOM_OUT_SCALE
    return write_medusa(path, res_w, res_b, out_w, name=f"random medusa heads (seed {seed})")


_RES_KEY = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
_OUT_KEY = re.compile(r"^(\d+)\.(\d+)\.weight$")


def heads_from_medusa_state_dict(state_dict: Mapping[str, torch.Tensor]) -> MedusaHeads:
    """MedusaHeads from the original Medusa checkpoint layout (``medusa_lm_head.pt``).

    There, ``medusa_head`` is a ModuleList of ``Sequential(ResBlock * L, Linear(H, V, bias=False))``
    with ``ResBlock.linear`` a biased Linear(H, H): keys ``{k}.{j}.linear.weight``,
    ``{k}.{j}.linear.bias`` and ``{k}.{L}.weight``, optionally prefixed ``medusa_head.``.
    Pass the result's tensors to ``write_medusa`` to make a file tsspec can attach.
    """
    res: dict[tuple[int, int, str], torch.Tensor] = {}
    out: dict[int, tuple[int, torch.Tensor]] = {}
    for raw_key, value in state_dict.items():
        key = raw_key.removeprefix("medusa_head.")
        if m := _RES_KEY.match(key):
            res[int(m[1]), int(m[2]), m[3]] = value
        elif m := _OUT_KEY.match(key):
            out[int(m[1])] = (int(m[2]), value)
        else:
            raise ValueError(f"unexpected key {raw_key!r} in a Medusa state dict")
    if not out:
        raise ValueError("no head projections ({k}.{L}.weight) in the state dict")
    k = max(out) + 1
    layers = out[0][0]
    if sorted(out) != list(range(k)) or any(index != layers for index, _ in out.values()):
        raise ValueError("heads disagree on their number of residual blocks")
    expected = {(h, j, part) for h in range(k) for j in range(layers) for part in ("weight", "bias")}
    if set(res) != expected:
        raise ValueError(f"residual blocks do not match {k} heads x {layers} blocks")
    hidden = out[0][1].shape[1]
    res_w = torch.zeros(k, layers, hidden, hidden)
    res_b = torch.zeros(k, layers, hidden)
    for h in range(k):
        for j in range(layers):
            res_w[h, j] = res[h, j, "weight"].float()
            res_b[h, j] = res[h, j, "bias"].float()
    out_w = torch.stack([out[h][1].float() for h in range(k)])  # [K, V, H]
    return MedusaHeads(res_w, res_b, out_w)
