"""Causal attention of new query rows over a KV cache, on the compiled CPU kernel.

``causal_attention(q, k_cache, v_cache, past)``: q [rows, >= heads * hd] (row-major, heads
then hd; extra columns such as K after Q are skipped by the row stride), caches [kv_heads,
capacity, hd] holding keys 0 .. past + rows - 1, query row t at position past + t sees keys
0 .. past + t. Returns [rows, heads * hd] float32. GQA: head h reads KV head h // (heads /
kv_heads). Q must already carry the 1/sqrt(hd) scale.

Why a kernel: each row is computed the same way whatever ``rows`` is (see cpu_kernels.c), so a
k-row verify reproduces the 1-row decode's attention bit for bit, which a batched torch matmul
does not promise; and one call replaces a dozen small torch ops per layer.
"""

from __future__ import annotations

import torch

from . import native

ROW_SLICE = 64  # query rows per kernel call


def causal_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, past: int, heads: int
) -> torch.Tensor:
    kernels = native.kernels()
    if kernels is None:
        raise RuntimeError("the compiled CPU kernels were not built")
    kv_heads, capacity, hd = k_cache.shape
    rows = q.shape[0]
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != torch.float32 or t.device.type != "cpu":
            raise ValueError(f"{name} must be float32 on the CPU")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.shape == k_cache.shape):
        raise ValueError("k_cache and v_cache must be contiguous [kv_heads, capacity, hd] of one shape")
    if q.dim() != 2 or q.stride(1) != 1 or q.shape[1] < heads * hd:
        raise ValueError(f"q must be [rows, >= {heads * hd}] with contiguous rows")
    out = torch.empty((rows, heads * hd), dtype=torch.float32)
    # long calls (prefill) go in slices of rows: the kernel's score buffer is rows x keys, and
    # a row's result does not depend on the slice it is in
    for start in range(0, rows, ROW_SLICE):
        stop = min(rows, start + ROW_SLICE)
        kernels.attention(
            q[start].data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), capacity,
            out[start].data_ptr(), stop - start, heads, kv_heads, hd, past + start, torch.get_num_threads(),
        )
    return out
