"""Host-side geometry of the launches: shapes, limits, grid sizes, slot offsets, pointer tables.

Pure Python (no CUDA, no CuPy) so every rule is tested on the CPU; ``ops`` calls these before
each launch and turns a violated limit into a ValueError instead of a kernel fault. The
numbers mirror the ``#define``s of the ``.cu`` sources.
"""

from __future__ import annotations

import math
from typing import Sequence

import attrs

# mirrors of the sources' constants
GDN_COLS, GDN_WARPS, GDN_MAX_DK = 32, 8, 256
INJ_MAX_ROWS = 32
ATT_WARPS, ATT_MAX_HEAD = 4, 256
ATT_THREADS = ATT_WARPS * 32
SEL_MAX_RANK, SEL_MAX_ROWS = 256, 64


def addresses(tensors: Sequence) -> list[int]:
    """Device addresses for a pointer table; None (an absent bias) is 0."""
    return [0 if t is None else int(t.data_ptr()) for t in tensors]


def overlaps(a, b) -> bool:
    """Whether two tensors' memory ranges intersect."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


@attrs.frozen
class GdnDims:
    nv: int
    dk: int
    dv: int
    kernel: int
    conv_dim: int

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return (self.nv, self.dk, self.dv)

    @property
    def state_size(self) -> int:
        return self.nv * self.dk * self.dv


def gdn_dims(conv_dim: int, num_k: int, dk: int, nv: int, kernel: int) -> GdnDims:
    """The layer's dimensions from the conv width ``2 num_k dk + nv dv``; checks the limits."""
    if not 1 <= dk <= GDN_MAX_DK:
        raise ValueError(f"gdn kernels take key heads up to {GDN_MAX_DK}, got {dk}")
    value_dim = conv_dim - 2 * num_k * dk
    if value_dim <= 0 or value_dim % nv:
        raise ValueError(f"conv width {conv_dim} is not 2 x {num_k} x {dk} + {nv} value heads")
    if nv % num_k:
        raise ValueError(f"{nv} value heads do not share {num_k} key heads evenly")
    return GdnDims(nv, dk, value_dim // nv, int(kernel), conv_dim)


def gdn_launch(dims: GdnDims) -> tuple[tuple[int, int], tuple[int], int]:
    """(grid, block, dynamic shared bytes) of gdn_verify / gdn_step."""
    grid = (math.ceil(dims.dv / GDN_COLS), dims.nv)
    shared_floats = 2 * dims.dk + GDN_WARPS * GDN_COLS + 32
    return grid, (GDN_COLS * GDN_WARPS,), 4 * shared_floats


def slot_conv_rows(m: int, kernel: int) -> tuple[int, int]:
    """Rows [lo, hi) of a verify's conv window that are slot m's conv state."""
    return m + 1, m + kernel


def check_slot_capacity(rows: int, slots_shape, window_shape, dims: GdnDims) -> None:
    if rows < 1:
        raise ValueError("a verify needs at least one row")
    if tuple(slots_shape[1:]) != dims.state_shape or slots_shape[0] < rows:
        raise ValueError(f"slots {tuple(slots_shape)} cannot hold {rows} states of {dims.state_shape}")
    if tuple(window_shape[1:]) != (dims.conv_dim,) or window_shape[0] < dims.kernel - 1 + rows:
        raise ValueError(f"window {tuple(window_shape)} cannot hold {dims.kernel - 1 + rows} rows of {dims.conv_dim}")


@attrs.frozen
class CommitPlan:
    layers: int
    state_size: int
    conv_dim: int
    kernel: int
    blocks: int


def commit_plan(slots, windows, states, convs, m: int) -> CommitPlan:
    """Check one gdn_commit of slot ``m`` over every layer (equal shapes) and size its grid."""
    layers = len(states)
    if not (len(slots) == len(windows) == len(convs) == layers):
        raise ValueError("gdn_commit needs one slot buffer, window, state and conv state per layer")
    if layers == 0:
        return CommitPlan(0, 0, 0, 0, 0)
    state_shape = tuple(states[0].shape)
    kernel = convs[0].shape[0] + 1
    conv_dim = convs[0].shape[1]
    for slot, window, state, conv in zip(slots, windows, states, convs):
        if tuple(state.shape) != state_shape or tuple(slot.shape[1:]) != state_shape:
            raise ValueError("gdn_commit: every layer's state and slots must share one shape")
        if not 0 <= m < slot.shape[0]:
            raise ValueError(f"slot {m} outside the {slot.shape[0]} slots")
        if tuple(conv.shape) != (kernel - 1, conv_dim) or window.shape[0] < m + kernel or window.shape[1] != conv_dim:
            raise ValueError(f"window {tuple(window.shape)} has no conv rows for slot {m}")
    state_size = math.prod(state_shape)
    blocks = max(1, min(1024, math.ceil(state_size / 4 / 256)))
    return CommitPlan(layers, state_size, conv_dim, kernel, blocks)


@attrs.frozen
class InjectPlan:
    rows: int
    features: int
    hidden: int
    layers: int
    nkv: int
    head_dim: int
    value_dim: int

    @property
    def useful_blocks(self) -> int:
        """Blocks beyond one warp per output feature would idle (8 warps per block)."""
        widest = max(self.hidden, self.layers * self.nkv * (self.head_dim + self.value_dim))
        return max(1, math.ceil(widest / 8))


def inject_plan(features_shape, fc_shape, layers, rings, positions: int) -> InjectPlan:
    n, F = features_shape
    H = fc_shape[0]
    if fc_shape[1] != F:
        raise ValueError(f"fc is {tuple(fc_shape)}, the features are {F} wide")
    if not 1 <= n <= INJ_MAX_ROWS or positions != n:
        raise ValueError(f"dflash_inject takes 1..{INJ_MAX_ROWS} rows with one position each, got {n}/{positions}")
    if len(layers) != len(rings) or not layers:
        raise ValueError("dflash_inject needs one K/V store per layer")
    keys0 = rings[0][0]
    nkv, hd, vd = keys0.shape[1], keys0.shape[2], rings[0][1].shape[2]
    if hd % 2:
        raise ValueError(f"NeoX RoPE needs an even head size, got {hd}")
    for keys, values, pos, ring_rows in rings:
        if tuple(keys.shape[1:]) != (nkv, hd) or tuple(values.shape[1:]) != (nkv, vd):
            raise ValueError("dflash_inject: every layer's store must share one head layout")
        if ring_rows and ring_rows < n:
            raise ValueError(f"a ring of {ring_rows} rows cannot take {n} rows in one launch")
        if ring_rows and ring_rows != keys.shape[0]:
            raise ValueError("ring rows differ from the store's capacity")
    return InjectPlan(n, F, H, len(layers), nkv, hd, vd)


@attrs.frozen
class AttentionPlan:
    rows: int
    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    context: int

    @property
    def shared_bytes(self) -> int:
        return 4 * ATT_WARPS * (2 + self.value_dim)


def attention_plan(q_shape, ctx_k_shape, ctx_v_shape, blk_k_shape) -> AttentionPlan:
    B, nh, hd = q_shape
    R, nkv, hd_k = ctx_k_shape
    vd = ctx_v_shape[2]
    if hd != hd_k or blk_k_shape[1:] != ctx_k_shape[1:] or blk_k_shape[0] != B:
        raise ValueError("dflash_block_attention: query, context and block keys disagree")
    if hd > ATT_MAX_HEAD or vd > ATT_MAX_HEAD:
        raise ValueError(f"head sizes up to {ATT_MAX_HEAD}")
    if nh % nkv:
        raise ValueError(f"{nh} query heads do not group over {nkv} kv heads")
    return AttentionPlan(B, nh, nkv, hd, vd, R)


def check_conv(x_shape, coef_shape, base_shape, group_size: int) -> None:
    B, H = x_shape
    K = base_shape[0]
    if tuple(base_shape) != (K, H) or H % group_size or tuple(coef_shape) != (B, K, H // group_size):
        raise ValueError(f"grouped conv shapes x {tuple(x_shape)}, coef {tuple(coef_shape)}, base {tuple(base_shape)} disagree")


@attrs.frozen
class LatticePlan:
    rows: int
    vocab: int
    hidden: int
    rank: int
    k: int

    @property
    def readback_floats(self) -> int:
        """The compact readback: k first scores + k*k per later row (candidate ids beside)."""
        return self.k + self.k * self.k * (self.rows - 1)


def lattice_plan(logits_shape, hidden_shape, p_shape, a_shape, top_k: int) -> LatticePlan:
    n, V = logits_shape
    r, Hd = p_shape
    if hidden_shape != (n, Hd) or tuple(a_shape) != (V, r):
        raise ValueError("selector_lattice: logits, hidden rows and codebooks disagree")
    if not 1 <= n <= SEL_MAX_ROWS or r > SEL_MAX_RANK:
        raise ValueError(f"selector_lattice takes 1..{SEL_MAX_ROWS} rows and rank <= {SEL_MAX_RANK}")
    return LatticePlan(n, V, Hd, r, min(int(top_k), V))
