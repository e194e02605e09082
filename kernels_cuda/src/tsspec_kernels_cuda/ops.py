"""The registered CUDA ops: launch wrappers over the compiled kernels, with the signatures of
``reference`` (the torch contract). Arguments are torch CUDA tensors, handed to CuPy through
DLPack (no copies) and launched on torch's current stream; host-side geometry lives in
``geometry`` so it is tested without a GPU.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from . import geometry
from .handoff import as_cupy, require, torch_stream
from .loader import LOADER
from .reference import InjectLayer, RingView

__all__ = [
    "gdn_verify", "gdn_step", "gdn_commit", "dflash_inject", "dflash_block_attention",
    "dflash_grouped_conv", "selector_lattice", "resident_blocks",
]

F32, I64 = torch.float32, torch.int64
_SCRATCH: dict[tuple, torch.Tensor] = {}


def _i32(x: int) -> np.int32:
    return np.int32(int(x))


def _f32(x: float) -> np.float32:
    return np.float32(float(x))


def _null() -> np.uint64:
    return np.uint64(0)


def _scratch(name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed device buffer kept per (name, device), grown on demand (barriers, sums)."""
    key = (name, dtype, device)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        buf = _SCRATCH[key] = torch.zeros(max(numel, 64), dtype=dtype, device=device)
    return buf


def _table(tensors: Sequence[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """[len] int64 device addresses (0 for None): the per-layer pointer tables."""
    return torch.tensor(geometry.addresses(tensors), dtype=I64).to(device, non_blocking=True)


def resident_blocks(device: torch.device) -> int:
    """Blocks a grid-barrier kernel may launch: one per multiprocessor."""
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _gdn_args(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, num_k, dk):
    rows, conv_dim = mixed.shape
    nv = a_neg.shape[0]
    dims = geometry.gdn_dims(conv_dim, num_k, dk, nv, conv_w.shape[1])
    require(mixed, "mixed", F32)
    require(conv_in, "conv_in", F32, shape=(dims.kernel - 1, conv_dim))
    require(conv_w, "conv_w", F32, shape=(conv_dim, dims.kernel))
    require(beta_logits, "beta_logits", F32, shape=(rows, nv))
    require(alpha_logits, "alpha_logits", F32, shape=(rows, nv))
    require(a_neg, "a_neg", F32)
    require(dt_bias, "dt_bias", F32, shape=(nv,))
    require(key_index, "key_index", I64, shape=(nv,))
    return dims


def gdn_verify(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, state, slots, window,
               *, num_k: int, dk: int, scale: float) -> torch.Tensor:
    dims = _gdn_args(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, num_k, dk)
    rows = mixed.shape[0]
    require(state, "state", F32, shape=dims.state_shape)
    require(slots, "slots", F32)
    require(window, "window", F32)
    geometry.check_slot_capacity(rows, slots.shape, window.shape, dims)
    out = torch.empty((rows, dims.nv, dims.dv), dtype=F32, device=mixed.device)
    grid, block, shared = geometry.gdn_launch(dims)
    with torch_stream(mixed.device):
        LOADER.function("gdn_verify")(grid, block, (
            as_cupy(mixed), as_cupy(conv_in), as_cupy(conv_w), as_cupy(beta_logits), as_cupy(alpha_logits),
            as_cupy(a_neg), as_cupy(dt_bias), as_cupy(key_index), as_cupy(state), as_cupy(out), as_cupy(slots),
            as_cupy(window), _i32(rows), _i32(num_k), _i32(dims.nv), _i32(dk), _i32(dims.dv), _i32(dims.kernel),
            _f32(scale)), shared_mem=shared)
    return out


def gdn_step(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, state_in, state_out,
             conv_out, *, num_k: int, dk: int, scale: float) -> torch.Tensor:
    dims = _gdn_args(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, num_k, dk)
    if mixed.shape[0] != 1:
        raise ValueError(f"gdn_step takes one row, got {mixed.shape[0]}")
    require(state_in, "state_in", F32, shape=dims.state_shape)
    require(state_out, "state_out", F32, shape=dims.state_shape)
    require(conv_out, "conv_out", F32, shape=conv_in.shape)
    if geometry.overlaps(conv_in, conv_out):
        raise ValueError("gdn_step: conv_out overlaps conv_in (double-buffer the live conv state)")
    out = torch.empty((1, dims.nv, dims.dv), dtype=F32, device=mixed.device)
    grid, block, shared = geometry.gdn_launch(dims)
    with torch_stream(mixed.device):
        LOADER.function("gdn_step")(grid, block, (
            as_cupy(mixed), as_cupy(conv_in), as_cupy(conv_w), as_cupy(beta_logits), as_cupy(alpha_logits),
            as_cupy(a_neg), as_cupy(dt_bias), as_cupy(key_index), as_cupy(state_in), as_cupy(out),
            as_cupy(state_out), as_cupy(conv_out), _i32(num_k), _i32(dims.nv), _i32(dk), _i32(dims.dv),
            _i32(dims.kernel), _f32(scale)), shared_mem=shared)
    return out


def gdn_commit(slots: Sequence[torch.Tensor], windows: Sequence[torch.Tensor], states: Sequence[torch.Tensor],
               convs: Sequence[torch.Tensor], m: int) -> None:
    plan = geometry.commit_plan(slots, windows, states, convs, m)
    if plan.layers == 0:
        return
    for t in (*slots, *windows, *states, *convs):
        require(t, "gdn_commit buffer", F32)
    device = states[0].device
    tables = [_table(group, device) for group in (slots, windows, states, convs)]
    with torch_stream(device):
        LOADER.function("gdn_commit")((plan.blocks, plan.layers), (256,), (
            *(as_cupy(t) for t in tables), _i32(m), np.int64(plan.state_size), _i32(plan.conv_dim),
            _i32(plan.kernel)))


def dflash_inject(features, fc, enc_norm, layers: Sequence[InjectLayer], rings: Sequence[RingView], positions,
                  *, eps: float, rope_base: float) -> None:
    device = features.device
    require(features, "features", F32)
    wdtype = fc.dtype
    if wdtype not in (F32, torch.bfloat16):
        raise ValueError(f"dflash_inject takes float32 or bfloat16 weights, not {wdtype}")
    plan = geometry.inject_plan(features.shape, fc.shape, layers, rings, positions.shape[0])
    for name, t in (("fc", fc), ("enc_norm", enc_norm)):
        require(t, name, wdtype)
    for wk, bk, wv, bv, k_norm in layers:
        for t in (wk, wv, k_norm, *(b for b in (bk, bv) if b is not None)):
            require(t, "layer weight", wdtype)
    for keys, values, pos, _ in rings:
        require(keys, "ring keys", F32)
        require(values, "ring values", F32)
        require(pos, "ring positions", I64)
    positions = require(positions.to(device=device, dtype=I64).contiguous(), "positions", I64)
    n, L = plan.rows, plan.layers
    ctx = _scratch("inject_ctx", n * plan.hidden, F32, device)
    kraw = _scratch("inject_kraw", L * n * plan.nkv * plan.head_dim, F32, device)
    sumsq = _scratch("inject_sumsq", n, F32, device)
    bar = _scratch("inject_barrier", 2, torch.int32, device)
    tables = [_table([layer[i] for layer in layers], device) for i in range(5)]
    ring_tables = [_table([ring[i] for ring in rings], device) for i in range(3)]
    ring_rows = torch.tensor([ring[3] for ring in rings], dtype=torch.int32).to(device)
    wk_t, bk_t, wv_t, bv_t, kn_t = tables
    with torch_stream(device):
        LOADER.function("dflash_inject", bf16_weights=wdtype == torch.bfloat16)(
            (min(resident_blocks(device), plan.useful_blocks),), (256,), (
                as_cupy(features), as_cupy(fc), as_cupy(enc_norm), as_cupy(wk_t), as_cupy(bk_t), as_cupy(wv_t),
                as_cupy(bv_t), as_cupy(kn_t), *(as_cupy(t) for t in ring_tables), as_cupy(ring_rows),
                as_cupy(positions), as_cupy(ctx), as_cupy(kraw), as_cupy(sumsq), as_cupy(bar), _i32(n),
                _i32(plan.features), _i32(plan.hidden), _i32(L), _i32(plan.nkv), _i32(plan.head_dim),
                _i32(plan.value_dim), _f32(eps), _f32(rope_base)))


def dflash_block_attention(q, ctx_k, ctx_v, ctx_pos, blk_k, blk_v, *, start: int, window: int | None,
                           scale: float) -> torch.Tensor:
    for name, t in (("q", q), ("ctx_k", ctx_k), ("ctx_v", ctx_v), ("blk_k", blk_k), ("blk_v", blk_v)):
        require(t, name, F32)
    require(ctx_pos, "ctx_pos", I64)
    plan = geometry.attention_plan(q.shape, ctx_k.shape, ctx_v.shape, blk_k.shape)
    out = torch.empty((plan.rows, plan.heads * plan.value_dim), dtype=F32, device=q.device)
    with torch_stream(q.device):
        LOADER.function("dflash_block_attention")((plan.rows, plan.heads), (geometry.ATT_THREADS,), (
            as_cupy(q), as_cupy(ctx_k), as_cupy(ctx_v), as_cupy(ctx_pos), as_cupy(blk_k), as_cupy(blk_v), as_cupy(out),
            _i32(plan.rows), _i32(plan.context), _i32(plan.heads), _i32(plan.kv_heads), _i32(plan.head_dim),
            _i32(plan.value_dim), np.int64(start), _i32(-1 if window is None else window), _f32(scale)),
            shared_mem=plan.shared_bytes)
    return out


def dflash_grouped_conv(x, coef, base, group_size: int, residual=None) -> torch.Tensor:
    require(x, "x", F32)
    require(base, "base", F32)
    if coef.dtype != F32 or coef.stride(-1) != 1 or coef.stride(-2) != coef.shape[-1]:
        raise ValueError("coef must be float32 with contiguous [K, G] rows")
    rows, hidden = x.shape
    geometry.check_conv(x.shape, coef.shape, base.shape, group_size)
    if residual is not None:
        require(residual, "residual", F32, shape=tuple(x.shape))
    out = torch.empty_like(x)
    total = rows * hidden
    with torch_stream(x.device):
        LOADER.function("dflash_grouped_conv")(((total + 255) // 256,), (256,), (
            as_cupy(x), as_cupy(coef), np.int64(coef.stride(0)), as_cupy(base),
            as_cupy(residual) if residual is not None else _null(), as_cupy(out), _i32(rows), _i32(hidden),
            _i32(base.shape[0]), _i32(group_size)))
    return out


def selector_lattice(logits, hidden, P, A, B, anchor: int, top_k: int):
    for name, t in (("logits", logits), ("hidden", hidden), ("P", P), ("A", A), ("B", B)):
        require(t, name, F32)
    plan = geometry.lattice_plan(logits.shape, hidden.shape, P.shape, A.shape, top_k)
    device = logits.device
    cand = torch.empty((plan.rows, plan.k), dtype=torch.int32, device=device)
    unary = torch.empty((plan.rows, plan.k), dtype=F32, device=device)
    first = torch.empty((plan.k,), dtype=F32, device=device)
    trans = torch.empty((max(plan.rows - 1, 0), plan.k, plan.k), dtype=F32, device=device)
    bar = _scratch("lattice_barrier", 2, torch.int32, device)
    with torch_stream(device):
        LOADER.function("selector_lattice")((plan.rows,), (256,), (
            as_cupy(logits), as_cupy(hidden), as_cupy(P), as_cupy(A), as_cupy(B), as_cupy(cand), as_cupy(unary),
            as_cupy(first), as_cupy(trans), as_cupy(bar), _i32(plan.rows), _i32(plan.vocab), _i32(plan.hidden),
            _i32(plan.rank), _i32(plan.k), np.int64(anchor)))
    return cand.long(), first, trans
