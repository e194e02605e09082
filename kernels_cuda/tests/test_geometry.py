"""Launch geometry and slot bookkeeping, checked without a GPU."""

from __future__ import annotations

import pytest
import torch

from tsspec_kernels_cuda import geometry


def test_gdn_dims_and_launch():
    dims = geometry.gdn_dims(conv_dim=2 * 2 * 16 + 4 * 24, num_k=2, dk=16, nv=4, kernel=4)
    assert (dims.nv, dims.dk, dims.dv, dims.state_shape) == (4, 16, 24, (4, 16, 24))
    grid, block, shared = geometry.gdn_launch(dims)
    assert grid == (1, 4) and block == (256,)
    assert shared == 4 * (2 * 16 + 8 * 32 + 32)
    big = geometry.gdn_dims(conv_dim=2 * 16 * 128 + 32 * 128, num_k=16, dk=128, nv=32, kernel=4)
    assert geometry.gdn_launch(big)[0] == (4, 32)


@pytest.mark.parametrize("args", [
    dict(conv_dim=100, num_k=2, dk=300, nv=4, kernel=4),  # key head too wide for the registers
    dict(conv_dim=2 * 2 * 16 + 10, num_k=2, dk=16, nv=4, kernel=4),  # value width not nv * dv
    dict(conv_dim=2 * 3 * 16 + 4 * 8, num_k=3, dk=16, nv=4, kernel=4),  # value heads not grouped
])
def test_gdn_dims_refuse(args):
    with pytest.raises(ValueError):
        geometry.gdn_dims(**args)


def test_slot_m_conv_state_is_a_window_slice():
    # window = [conv state (K-1 rows); row 0 .. row rows-1]; after row m the conv state is the
    # last K-1 pre-conv rows up to and including row m
    K, rows = 4, 5
    window = torch.arange(K - 1 + rows)
    for m in range(rows):
        lo, hi = geometry.slot_conv_rows(m, K)
        assert window[lo:hi].tolist() == list(range(m + 1, m + K))
        assert hi - lo == K - 1


def test_slot_capacity():
    dims = geometry.gdn_dims(2 * 4 + 2 * 3, 1, 4, 2, 3)
    geometry.check_slot_capacity(4, (4, 2, 4, 3), (6, 14), dims)
    with pytest.raises(ValueError):
        geometry.check_slot_capacity(5, (4, 2, 4, 3), (7, 14), dims)  # more rows than slots
    with pytest.raises(ValueError):
        geometry.check_slot_capacity(4, (4, 2, 4, 3), (5, 14), dims)  # window too short
    with pytest.raises(ValueError):
        geometry.check_slot_capacity(0, (4, 2, 4, 3), (6, 14), dims)


def test_commit_plan_checks_every_layer():
    slots = [torch.zeros(4, 2, 4, 3) for _ in range(3)]
    windows = [torch.zeros(6, 14) for _ in range(3)]
    states = [torch.zeros(2, 4, 3) for _ in range(3)]
    convs = [torch.zeros(2, 14) for _ in range(3)]
    plan = geometry.commit_plan(slots, windows, states, convs, 3)
    assert (plan.layers, plan.state_size, plan.conv_dim, plan.kernel) == (3, 24, 14, 3)
    with pytest.raises(ValueError):
        geometry.commit_plan(slots, windows, states, convs, 4)  # no slot 4
    with pytest.raises(ValueError):
        geometry.commit_plan(slots, windows[:2], states, convs, 0)
    short = [torch.zeros(4, 14)] * 3  # window has no rows m+1 .. m+K-1 for m = 3
    with pytest.raises(ValueError):
        geometry.commit_plan(slots, short, states, convs, 3)
    assert geometry.commit_plan([], [], [], [], 0).layers == 0


def test_overlap_and_addresses():
    buf = torch.zeros(10)
    assert geometry.overlaps(buf[:5], buf[4:])
    assert not geometry.overlaps(buf[:5], buf[5:])
    assert geometry.addresses([buf, None]) == [buf.data_ptr(), 0]


def _rings(n_layers, rows, nkv=2, hd=8, vd=6):
    return [(torch.zeros(rows or 16, nkv, hd), torch.zeros(rows or 16, nkv, vd), torch.full((rows or 16,), -1), rows)
            for _ in range(n_layers)]


def test_inject_plan_limits():
    plan = geometry.inject_plan((3, 40), (32, 40), [None] * 2, _rings(2, 48), 3)
    assert (plan.rows, plan.layers, plan.nkv, plan.head_dim, plan.value_dim) == (3, 2, 2, 8, 6)
    assert plan.useful_blocks >= 1
    with pytest.raises(ValueError):
        geometry.inject_plan((33, 40), (32, 40), [None] * 2, _rings(2, 48), 33)  # over INJ_MAX_ROWS
    with pytest.raises(ValueError):
        geometry.inject_plan((3, 40), (32, 41), [None] * 2, _rings(2, 48), 3)
    with pytest.raises(ValueError):
        geometry.inject_plan((8, 40), (32, 40), [None] * 2, _rings(2, 4), 8)  # ring smaller than the write


def test_lattice_readback_size():
    plan = geometry.lattice_plan((6, 1000), (6, 32), (16, 32), (1000, 16), 4)
    assert plan.readback_floats == 4 + 4 * 4 * 5  # k + k*k*(n-1), not n * vocab
    with pytest.raises(ValueError):
        geometry.lattice_plan((6, 1000), (6, 32), (300, 32), (1000, 300), 4)  # rank over the limit


def test_attention_and_conv_shapes():
    plan = geometry.attention_plan((5, 4, 8), (64, 2, 8), (64, 2, 6), (5, 2, 8))
    assert plan.shared_bytes == 4 * geometry.ATT_WARPS * (2 + 6)
    with pytest.raises(ValueError):
        geometry.attention_plan((5, 3, 8), (64, 2, 8), (64, 2, 6), (5, 2, 8))
    geometry.check_conv((5, 8), (5, 3, 2), (3, 8), 4)
    with pytest.raises(ValueError):
        geometry.check_conv((5, 8), (5, 3, 4), (3, 8), 4)
