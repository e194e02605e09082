"""Checking, dequantising and laying out the weights of a llama GGUF for a fast forward.

Every tensor's presence and shape is checked before anything is read, so a bad file fails in
milliseconds with the tensor's name. The layout the forward wants differs from the file's:

* Q, K and V are one matrix ``wqkv`` [(n_heads + 2 n_kv) * hd, H]; gate and up are one
  ``w_gate_up`` [2 F, H]: one GEMM instead of three (two) per layer.
* The attention scale 1/sqrt(hd) is folded into the Q rows (one multiply fewer per layer).
* Q and K keep llama.cpp's per-head row permutation (adjacent RoPE pairs, see rope.py); a
  NEOX family's rows (pairs i, i + rope_dim/2) are permuted to that order here, with their
  biases and per-head norm weights, so one RoPE serves every family. With per-head Q norms
  the attention scale folds into the Q norm's weight instead.
* A family's fused tensors (phi3's ``attn_qkv``, ``ffn_up`` = [gate; up]) are read in place of
  the separate ones (``families.py``).
* Tied embeddings (no ``output.weight``) share one tensor for the embedding and the LM head.

Block mode (``blocks=True``, the CPU default): the matrices stay in the file's quantised blocks
(``tsspec_gguf.qlinear.BlockMatrix``: Q4_0/1, Q5_0/1, Q8_0, Q4_K, Q5_K, Q6_K) and are
stored as their ``q``/``d``/``m`` tensors under the matrix's name (``l3.wqkv.q4``,
``l3.wqkv.d``, ...); a matrix with a part of another type runs as float32 weights (format 32),
and ``SERVED_KEY`` counts such tensors per type for the loader's warning and ``--stats``.
``tsspec_gguf.cache.join_block_matrices`` turns the flat dict back into tensors and BlockMatrix objects.
F16 / BF16 matrices stay 16-bit blocks (formats F16, BF16); ``half`` (``--dtype float16`` /
``bfloat16``) rounds every matrix, the embedding included, to that 16-bit format instead.

The prepared tensors go through ``tsspec_gguf.cache.WeightCache``; a warm load maps them back.
"""

from __future__ import annotations

import json
from typing import Iterator

import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf.cache import join_block_matrices
from tsspec_gguf.qlinear import BF16, F16, BlockMatrix, pack_tensor

from .hparams import LlamaHParams

LAYOUT_TAG = "llama-fused-v3"  # bump when the prepared layout changes (invalidates caches)
BLOCK_LAYOUT_TAG = "llama-blocks-v5"  # v2: K-quants (formats 4, 8, 16); v3: format 32; v4: families, Q5_0/1; v5: F16, BF16
HALF_FORMATS = {"float16": F16, "bfloat16": BF16}  # --dtype -> the 16-bit block format of every matrix
SERVED_KEY = "served_formats"  # ggml type -> (tensors in blocks, tensors as float32), JSON bytes
MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")  # per-layer names that may be BlockMatrix


def residual_dtype(dtype: torch.dtype) -> torch.dtype:
    """The residual stream and norms stay float32 whatever the matmul dtype (float64 for the
    float64 reference mode)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _names(hp: LlamaHParams, i: int) -> dict[str, str]:
    """Per-layer tensor names by role, for this family's layout."""
    p, fam = f"blk.{i}.", hp.family
    names = {"attn_norm": p + "attn_norm.weight", "wo": p + "attn_output.weight", "ffn_norm": p + "ffn_norm.weight",
             "w_down": p + "ffn_down.weight"}
    if fam.fused_qkv:
        names["wqkv"] = p + "attn_qkv.weight"
    else:
        names.update(wq=p + "attn_q.weight", wk=p + "attn_k.weight", wv=p + "attn_v.weight")
    if fam.fused_gate_up:
        names["w_gate_up"] = p + "ffn_up.weight"
    else:
        names.update(w_gate=p + "ffn_gate.weight", w_up=p + "ffn_up.weight")
    if fam.qk_norm:
        names.update(q_norm=p + "attn_q_norm.weight", k_norm=p + "attn_k_norm.weight")
    if fam.post_norms:
        names.update(post_attn_norm=p + "post_attention_norm.weight", post_ffn_norm=p + "post_ffw_norm.weight")
    return names


def expected_tensors(hp: LlamaHParams, gguf_file) -> dict[str, tuple[int, ...]]:
    """name -> numpy-order shape of every tensor the forward reads (optional ones if present)."""
    H, F, V, hd = hp.hidden_size, hp.ffn_size, hp.vocab_size, hp.head_dim
    qkv = hp.q_size + 2 * hp.kv_size
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    if gguf_file.has_tensor("output.weight"):
        shapes["output.weight"] = (V, H)
    if gguf_file.has_tensor("rope_freqs.weight"):
        shapes["rope_freqs.weight"] = (hp.rope_dim // 2,)
    role_shapes = {"attn_norm": (H,), "ffn_norm": (H,), "wq": (hp.q_size, H), "wk": (hp.kv_size, H),
                   "wv": (hp.kv_size, H), "wqkv": (qkv, H), "wo": (H, hp.q_size), "w_gate": (F, H), "w_up": (F, H),
                   "w_gate_up": (2 * F, H), "w_down": (H, F), "q_norm": (hd,), "k_norm": (hd,),
                   "post_attn_norm": (H,), "post_ffn_norm": (H,)}
    for i in range(hp.n_layers):
        p = f"blk.{i}."
        shapes.update({name: role_shapes[role] for role, name in _names(hp, i).items()})
        for name, size in (("attn_q", hp.q_size), ("attn_k", hp.kv_size), ("attn_v", hp.kv_size),
                           ("attn_qkv", qkv), ("attn_output", H)):
            if gguf_file.has_tensor(p + name + ".bias"):
                shapes[p + name + ".bias"] = (size,)
    return shapes


def check_tensors(hp: LlamaHParams, gguf_file) -> dict[str, tuple[int, ...]]:
    """Presence and shape of every tensor, and no unexpected kind of layer (e.g. MoE)."""
    if gguf_file.has_tensor("blk.0.ffn_gate_inp.weight"):
        raise ModelLoadError(gguf_file.path, "mixture-of-experts files are not supported by this plugin")
    if gguf_file.has_tensor(f"blk.{hp.n_layers}.attn_norm.weight"):
        raise ModelLoadError(
            gguf_file.path, f"has a layer {hp.n_layers} beyond block_count {hp.n_layers}"
        )
    shapes = expected_tensors(hp, gguf_file)
    for name, shape in shapes.items():
        gguf_file.check_tensor(name, shape)
    return shapes


def neox_order(head_dim: int, rope_dim: int) -> torch.Tensor:
    """Index of a head's dims that turns NEOX pairs (i, i + rope_dim/2) into adjacent pairs
    (2i, 2i + 1); dims past rope_dim stay where they are. [head_dim] long."""
    half = rope_dim // 2
    rotated = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)
    return torch.cat([rotated, torch.arange(rope_dim, head_dim)])


def _head_rows(hp: LlamaHParams, heads: int) -> torch.Tensor | None:
    """Row order of a Q or K projection with ``heads`` heads (None: keep the file's order)."""
    if not hp.family.rope_neox:
        return None
    order = neox_order(hp.head_dim, hp.rope_dim)
    return (torch.arange(heads)[:, None] * hp.head_dim + order[None, :]).reshape(-1)


class _Source:
    """Reads a matrix as blocks (``blocks=True``: None when its type has no block form) or as
    float32 rows, and notes each matrix tensor's ggml type and whether it stayed in blocks."""

    def __init__(self, gguf_file, blocks: bool, half: int | None = None):
        self.file, self.blocks, self.half = gguf_file, blocks, half
        self.served: dict[str, list[int]] = {}  # ggml type -> [tensors in blocks, tensors as float32]

    def parts(self, names: list[str]) -> list:
        if self.blocks:
            packed = [pack_tensor(self.file.tensor_bytes(n), self.file.tensor_info(n).ggml_type,
                                  self.file.tensor_info(n).shape, halves=True) for n in names]
            if all(p is not None for p in packed):
                self._note(names, True)
                return packed
            self._note(names, False)
        return [self.file.tensor(n) for n in names]

    def _note(self, names: list[str], in_blocks: bool) -> None:
        for n in names:
            kind = self.file.tensor_info(n).ggml_type
            counts = self.served.setdefault(getattr(kind, "name", str(kind)), [0, 0])
            counts[0 if in_blocks else 1] += 1


def _rows_of(part, index: torch.Tensor):
    if isinstance(part, BlockMatrix):
        return BlockMatrix(part.fmt, part.q[index], part.d[index], part.m[index])
    return part[index]


def _scaled(part, factor: float):
    if factor == 1.0:
        return part
    return part.scaled(factor) if isinstance(part, BlockMatrix) else part * factor


def _join(key: str, parts: list, dtype: torch.dtype, blocks: bool, half: int | None = None):
    """(key, tensor) pairs of rows stacked: block parts as one BlockMatrix, float32 parts as
    format-32 blocks (so every matrix runs on the row-invariant kernel) or, without blocks,
    the dense rows in ``dtype``; with ``half`` every part as that 16-bit format."""
    if half is not None and blocks:
        as_half = [p if isinstance(p, BlockMatrix) and p.fmt == half else
                   BlockMatrix.half(p.dequantize() if isinstance(p, BlockMatrix) else p, half) for p in parts]
        joined = as_half[0] if len(as_half) == 1 else BlockMatrix.concat(as_half)
        return list(joined.tensors(key).items())
    if all(isinstance(p, BlockMatrix) for p in parts):
        joined = parts[0] if len(parts) == 1 else BlockMatrix.concat(parts)
        return list(joined.tensors(key).items())
    dense = parts[0] if len(parts) == 1 else torch.cat(parts)
    if blocks and dense.shape[-1] % 32 == 0:
        return list(BlockMatrix.dense(dense).tensors(key).items())
    return [(key, dense.to(dtype))]


def _qkv(hp: LlamaHParams, source: _Source, names: dict[str, str], q_scale: float) -> list:
    """[Q, K, V] row blocks in the runtime's order: NEOX heads permuted to adjacent pairs, Q
    times ``q_scale``."""
    if "wqkv" in names:
        (fused,) = source.parts([names["wqkv"]])
        cuts = [0, hp.q_size, hp.q_size + hp.kv_size, hp.q_size + 2 * hp.kv_size]
        parts = [_rows_of(fused, torch.arange(a, b)) for a, b in zip(cuts, cuts[1:])]
    else:
        parts = source.parts([names["wq"], names["wk"], names["wv"]])
    for j, heads in ((0, hp.n_heads), (1, hp.n_kv_heads)):
        order = _head_rows(hp, heads)
        if order is not None:
            parts[j] = _rows_of(parts[j], order)
    parts[0] = _scaled(parts[0], q_scale)
    return parts


def _qkv_bias(hp: LlamaHParams, gguf_file, p: str, q_scale: float) -> torch.Tensor | None:
    if gguf_file.has_tensor(p + "attn_qkv.bias"):
        fused = gguf_file.tensor(p + "attn_qkv.bias")
        parts = list(torch.split(fused, [hp.q_size, hp.kv_size, hp.kv_size]))
    elif gguf_file.has_tensor(p + "attn_q.bias"):
        parts = [gguf_file.tensor(p + f"attn_{x}.bias") for x in "qkv"]
    else:
        return None
    for j, heads in ((0, hp.n_heads), (1, hp.n_kv_heads)):
        order = _head_rows(hp, heads)
        if order is not None:
            parts[j] = parts[j][order]
    parts[0] = parts[0] * q_scale
    return torch.cat(parts)


def _layer_tensors(
    hp: LlamaHParams, source: _Source, i: int, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    gguf_file, blocks = source.file, source.blocks
    p, names = f"blk.{i}.", _names(hp, i)
    norm_dtype = residual_dtype(dtype)

    def vector(role: str) -> torch.Tensor:
        return gguf_file.tensor(names[role]).to(norm_dtype)

    # the attention scale folds into Q's rows (exact for hd = 4^k), or with per-head Q norms
    # into the Q norm's weight (the norm would undo a scale on the rows)
    q_scale = 1.0 if hp.family.qk_norm else hp.q_scale
    yield f"l{i}.attn_norm", vector("attn_norm")
    yield from _join(f"l{i}.wqkv", _qkv(hp, source, names, q_scale), dtype, blocks, source.half)
    bias = _qkv_bias(hp, gguf_file, p, q_scale)
    if bias is not None:
        yield f"l{i}.bqkv", bias.to(dtype)
    if hp.family.qk_norm:
        order = neox_order(hp.head_dim, hp.rope_dim) if hp.family.rope_neox else torch.arange(hp.head_dim)
        yield f"l{i}.q_norm", (vector("q_norm")[order] * hp.q_scale).to(norm_dtype)
        yield f"l{i}.k_norm", vector("k_norm")[order]
    yield from _join(f"l{i}.wo", source.parts([names["wo"]]), dtype, blocks, source.half)
    if gguf_file.has_tensor(p + "attn_output.bias"):
        yield f"l{i}.bo", gguf_file.tensor(p + "attn_output.bias").to(dtype)
    yield f"l{i}.ffn_norm", vector("ffn_norm")
    if hp.family.post_norms:
        yield f"l{i}.post_attn_norm", vector("post_attn_norm")
        yield f"l{i}.post_ffn_norm", vector("post_ffn_norm")
    gate_up = [names["w_gate_up"]] if "w_gate_up" in names else [names["w_gate"], names["w_up"]]
    yield from _join(f"l{i}.w_gate_up", source.parts(gate_up), dtype, blocks, source.half)
    yield from _join(f"l{i}.w_down", source.parts([names["w_down"]]), dtype, blocks, source.half)


def prepare_weights(
    hp: LlamaHParams, gguf_file, dtype: torch.dtype, blocks: bool = False, half: int | None = None
) -> dict[str, torch.Tensor]:
    """The forward's tensors (see the module docstring), all on the CPU, plus ``served``: how
    each ggml type of the file's matrices runs (``served_formats``)."""
    source = _Source(gguf_file, blocks, half)
    out: dict[str, torch.Tensor] = dict(_join("embed", source.parts(["token_embd.weight"]), dtype, blocks, source.half))
    out["output_norm"] = gguf_file.tensor("output_norm.weight").to(residual_dtype(dtype))
    if gguf_file.has_tensor("output.weight"):
        out.update(_join("lm_head", source.parts(["output.weight"]), dtype, blocks, source.half))
    if gguf_file.has_tensor("rope_freqs.weight"):
        out["rope_freqs"] = gguf_file.tensor("rope_freqs.weight").to(torch.float32)
    for i in range(hp.n_layers):
        out.update(_layer_tensors(hp, source, i, dtype))
    out[SERVED_KEY] = encode_served(source.served)
    return out


def encode_served(served: dict[str, list[int]]) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(served, sort_keys=True).encode()), dtype=torch.uint8)


def decode_served(data: torch.Tensor) -> dict[str, tuple[int, int]]:
    return {k: (int(v[0]), int(v[1])) for k, v in json.loads(bytes(data.tolist()).decode()).items()}


def load_weights(
    hp: LlamaHParams, gguf_file, dtype: torch.dtype, cache=None, *, blocks: bool = False, half: int | None = None
) -> dict[str, torch.Tensor | BlockMatrix]:
    """Checked, prepared weights (block matrices joined), through the load cache when given;
    ``weights[SERVED_KEY]`` is how each ggml type of the matrices runs: {type: (in blocks, as
    float32)} tensor counts."""
    check_tensors(hp, gguf_file)
    if cache is None:
        prepared = prepare_weights(hp, gguf_file, dtype, blocks, half)
    else:
        from tsspec_gguf.cache import cache_key

        tag = BLOCK_LAYOUT_TAG if blocks else LAYOUT_TAG
        key = cache_key(gguf_file, tag if half is None else f"{tag}-half{half}", dtype)
        prepared = cache.load_or_build(key, lambda: prepare_weights(hp, gguf_file, dtype, blocks, half))
    prepared = dict(prepared)
    served = decode_served(prepared.pop(SERVED_KEY))
    weights = join_block_matrices(prepared)
    weights[SERVED_KEY] = served
    return weights
