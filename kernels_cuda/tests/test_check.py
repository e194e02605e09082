"""The device check's harness, run on the CPU with the contracts standing in for the kernels:
it reports ~0 for a faithful implementation and an error for a broken one (it can fail), and its
oracle is the float64 equations, so a mistake the kernel shares with its contract is caught."""

from __future__ import annotations

import math

import torch

from tsspec_kernels_cuda import check, reference

OPS = {op: getattr(reference, op) for op in (
    "gdn_verify", "gdn_step", "gdn_commit", "dflash_inject", "dflash_block_attention", "dflash_grouped_conv",
    "selector_lattice")}


def test_faithful_ops_pass_every_check():
    errors = {**check.check_gdn(OPS, check.TINY, "cpu"), **check.check_dflash(OPS, check.TINY, "cpu"),
              **check.check_lattice(OPS, check.TINY, "cpu")}
    assert len(errors) >= 20
    assert max(errors.values()) < 1e-6, {k: v for k, v in errors.items() if v >= 1e-6}


def test_a_slot_left_unwritten_is_caught():
    def lazy_verify(mixed, *args, **kwargs):
        slots = args[8]
        out = reference.gdn_verify(mixed, *args, **kwargs)
        slots[1].fill_(float("nan"))  # as if the kernel never wrote slot 1
        return out

    errors = check.check_gdn({**OPS, "gdn_verify": lazy_verify}, check.TINY, "cpu")
    assert math.isinf(errors["gdn_verify.slots"])


def test_a_wrong_commit_is_caught():
    def off_by_one(slots, windows, states, convs, m):
        reference.gdn_commit(slots, windows, states, convs, m - 1)

    errors = check.check_gdn({**OPS, "gdn_commit": off_by_one}, check.TINY, "cpu")
    assert errors["gdn_commit.state"] > 1e-3 and errors["gdn_commit.conv"] > 1e-3


def test_bytes_floors_count_the_slots():
    s = check.TINY
    state = s.nv * s.dk * s.dv * 4
    assert check.gdn_bytes(s, 4) - check.gdn_bytes(s, 3) >= state  # one more slot written
    assert check.inject_bytes(s) > 4 * s.hidden * s.taps * s.hidden
    assert check.median_ms(lambda: torch.ones(10).sum(), "cpu", reps=3, warmup=1) >= 0


def test_a_mistake_shared_with_the_contract_is_caught(monkeypatch):
    """A contract with a wrong L2 epsilon, standing in for the kernel too: the equations differ."""
    monkeypatch.setattr(reference, "L2_EPS", 0.5)
    errors = check.check_gdn(OPS, check.TINY, "cpu")
    assert errors["gdn_verify.out"] > 1e-3


def test_a_wrong_norm_shared_with_the_contract_is_caught(monkeypatch):
    """The drafter's RMSNorm without its epsilon's square root, in the contract and the kernel alike."""
    monkeypatch.setattr(reference, "_rms", lambda x, w, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 0.5) * w)
    errors = check.check_dflash(OPS, check.TINY, "cpu")
    assert errors["dflash_inject.keys[0]"] > 1e-3
