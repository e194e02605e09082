"""The device check's measurements: every op against ``equations`` (the ops written again from
their maths in float64, independent of the ``reference`` contracts the kernels implement; fresh
random inputs, outputs poisoned with NaN first so an unwritten element fails), per-row slots
after a partial acceptance, and timings against the bytes-moved floor and the torch contracts.

Device-agnostic: ``impl`` is any {op: callable} table, so the CPU dry run checks the contracts
themselves against the equations and ``scripts/device_check.py`` runs it with the CUDA ops at
realistic sizes.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import attrs
import torch

from . import equations, reference
from .walk import readback, walk_compact

F32 = torch.float32


@attrs.frozen
class Sizes:
    # GDN layer (Qwen3-Next / Qwen 3.5 class: 16 key heads, 32 value heads of 128, conv 4)
    nk: int = 16
    nv: int = 32
    dk: int = 128
    dv: int = 128
    conv_kernel: int = 4
    verify_rows: int = 8  # k + 1 with k = 7 drafts
    gdn_layers: int = 48  # timed launches rotate over this many layers' states (beats the L2)
    # DFlash drafter (8B-class target: width 4096, 5 taps, 5 layers, block 16)
    hidden: int = 4096
    taps: int = 5
    d_layers: int = 5
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block: int = 16
    ring_rows: int = 2080  # window 2048 + block + spare, padded
    context: int = 2048
    inject_rows: int = 8
    conv_k: int = 4
    conv_group: int = 64
    # selector
    vocab: int = 151936
    rank: int = 64
    top_k: int = 8
    # the target whose decode step a DFlash block is compared with: bytes of its weights
    target_bytes: int = 16 * 10**9  # an 8B-parameter model in bf16


TINY = Sizes(nk=2, nv=4, dk=16, dv=40, verify_rows=5, gdn_layers=3, hidden=64, taps=2, d_layers=2, heads=4,
             kv_heads=2, head_dim=16, block=5, ring_rows=48, context=30, inject_rows=4, conv_k=3, conv_group=8,
             vocab=300, rank=8, top_k=4, target_bytes=10**6)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| in float64; NaN anywhere is an infinite error."""
    got, want = got.detach().double(), want.detach().double()
    if torch.isnan(got).any():
        return float("inf")
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _rand(g, *shape, scale=1.0, device="cpu"):
    return (torch.randn(*shape, generator=g) * scale).to(device)


def gdn_case(s: Sizes, device, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    conv_dim = 2 * s.nk * s.dk + s.nv * s.dv
    rows = s.verify_rows
    return dict(
        mixed=_rand(g, rows, conv_dim, device=device), conv_in=_rand(g, s.conv_kernel - 1, conv_dim, device=device),
        conv_w=_rand(g, conv_dim, s.conv_kernel, scale=0.5, device=device),
        beta=_rand(g, rows, s.nv, device=device), alpha=_rand(g, rows, s.nv, device=device),
        a_neg=(-torch.rand(s.nv, generator=g) * 2).to(device), dt_bias=_rand(g, s.nv, device=device),
        key_index=(torch.arange(s.nv) // (s.nv // s.nk)).to(device),
        state=_rand(g, s.nv, s.dk, s.dv, scale=0.1, device=device),
    )


def _gdn_verify(ops, c, s, rows):
    conv_dim = c["mixed"].shape[1]
    slots = torch.full((rows, s.nv, s.dk, s.dv), float("nan"), device=c["state"].device)
    window = torch.full((s.conv_kernel - 1 + rows, conv_dim), float("nan"), device=c["state"].device)
    out = ops["gdn_verify"](c["mixed"][:rows], c["conv_in"], c["conv_w"], c["beta"][:rows], c["alpha"][:rows],
                            c["a_neg"], c["dt_bias"], c["key_index"], c["state"], slots, window,
                            num_k=s.nk, dk=s.dk, scale=s.dk**-0.5)
    return out, slots, window


def check_gdn(impl: dict, s: Sizes, device, seed: int = 0) -> dict[str, float]:
    """Max relative errors of gdn_verify (outputs, every slot, the window), gdn_commit after a
    partial acceptance, and gdn_step from a pending slot and in place."""
    c = gdn_case(s, device, seed)
    ref = {op: getattr(equations, op) for op in ("gdn_verify", "gdn_step", "gdn_commit")}
    before = c["state"].clone()
    out, slots, window = _gdn_verify(impl, c, s, s.verify_rows)
    r_out, r_slots, r_window = _gdn_verify(ref, c, s, s.verify_rows)
    errors = {"gdn_verify.out": rel_err(out, r_out), "gdn_verify.slots": rel_err(slots, r_slots),
              "gdn_verify.window": rel_err(window, r_window),
              "gdn_verify.live_untouched": 0.0 if torch.equal(before, c["state"]) else float("inf")}
    m = s.verify_rows // 2  # partial acceptance: keep rows 0..m
    live, conv = c["state"].clone(), torch.full_like(c["conv_in"], float("nan"))
    impl["gdn_commit"]([slots], [window], [live], [conv], m)
    errors["gdn_commit.state"] = rel_err(live, r_slots[m])
    errors["gdn_commit.conv"] = rel_err(conv, r_window[m + 1 : m + s.conv_kernel])
    step = {k: v[:1] if k in ("mixed", "beta", "alpha") else v for k, v in gdn_case(s, device, seed + 1).items()}
    lo, hi = m + 1, m + s.conv_kernel
    # deferred: start from slot m without committing it (new state into another buffer);
    # in place: start from the committed state and overwrite it (state_in is state_out)
    for name, state_in in (("deferred", True), ("in_place", None)):
        outs = []
        for ops in (impl, ref):  # the same inputs for both: the reference's slot m, or the live state
            src = r_slots[m].clone()
            dst = src if state_in is None else torch.full_like(src, float("nan"))
            conv_src = r_window[lo:hi].clone()
            conv_out = torch.full_like(conv_src, float("nan"))
            o = ops["gdn_step"](step["mixed"], conv_src, c["conv_w"], step["beta"], step["alpha"], c["a_neg"],
                                c["dt_bias"], c["key_index"], src, dst, conv_out, num_k=s.nk, dk=s.dk, scale=s.dk**-0.5)
            outs.append((o, dst, conv_out))
        (o, st, cv), (ro, rst, rcv) = outs
        errors[f"gdn_step.{name}.out"] = rel_err(o, ro)
        errors[f"gdn_step.{name}.state"] = rel_err(st, rst)
        errors[f"gdn_step.{name}.conv"] = rel_err(cv, rcv)
    return errors


def dflash_case(s: Sizes, device, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    H, hd, nkv = s.hidden, s.head_dim, s.kv_heads
    layers = [reference.InjectLayer(_rand(g, nkv * hd, H, scale=H**-0.5, device=device),
                                    _rand(g, nkv * hd, scale=0.1, device=device) if i == 0 else None,
                                    _rand(g, nkv * hd, H, scale=H**-0.5, device=device), None,
                                    (1 + 0.2 * torch.randn(hd, generator=g)).to(device))
              for i in range(s.d_layers)]
    return dict(features=_rand(g, s.inject_rows, s.taps * H, device=device),
                fc=_rand(g, H, s.taps * H, scale=(s.taps * H) ** -0.5, device=device),
                enc_norm=(1 + 0.2 * torch.randn(H, generator=g)).to(device), layers=layers,
                positions=torch.arange(s.context, s.context + s.inject_rows, device=device))


def _rings(s: Sizes, device, linear_every: int = 2):
    """Each layer's store: a ring, or every ``linear_every``-th a linear store (slot = position)."""
    rings = []
    for i in range(s.d_layers):
        rows = 0 if i % linear_every == linear_every - 1 else s.ring_rows
        cap = rows or (s.context + s.inject_rows + s.block)
        rings.append(reference.RingView(torch.full((cap, s.kv_heads, s.head_dim), float("nan"), device=device),
                                        torch.full((cap, s.kv_heads, s.head_dim), float("nan"), device=device),
                                        torch.full((cap,), -1, dtype=torch.long, device=device), rows))
    return rings


def check_dflash(impl: dict, s: Sizes, device, seed: int = 0) -> dict[str, float]:
    c = dflash_case(s, device, seed)
    errors = {}
    got, want = _rings(s, device), _rings(s, device)
    for ops, rings in ((impl, got), ({"dflash_inject": equations.dflash_inject}, want)):
        ops["dflash_inject"](c["features"], c["fc"], c["enc_norm"], c["layers"], rings, c["positions"],
                             eps=1e-6, rope_base=1e6)
    for i, (a, b) in enumerate(zip(got, want)):
        slots = c["positions"] % b[3] if b[3] else c["positions"]
        errors[f"dflash_inject.keys[{i}]"] = rel_err(a[0][slots], b[0][slots])
        errors[f"dflash_inject.values[{i}]"] = rel_err(a[1][slots], b[1][slots])
        errors[f"dflash_inject.positions[{i}]"] = 0.0 if torch.equal(a[2], b[2]) else float("inf")
    g = torch.Generator().manual_seed(seed + 7)
    B, nh, nkv, hd = s.block, s.heads, s.kv_heads, s.head_dim
    R = s.ring_rows
    q = _rand(g, B, nh, hd, device=device)
    ctx_k, ctx_v = _rand(g, R, nkv, hd, device=device), _rand(g, R, nkv, hd, device=device)
    start = s.context
    pos = torch.arange(start - R, start, device=device)
    pos[::7] = -1  # empty slots
    blk_k, blk_v = _rand(g, B, nkv, hd, device=device), _rand(g, B, nkv, hd, device=device)
    for window in (None, s.ring_rows - s.block - 8):
        args = (q, ctx_k, ctx_v, pos, blk_k, blk_v)
        kw = dict(start=start, window=window, scale=hd**-0.5)
        errors[f"dflash_block_attention.window={window}"] = rel_err(
            impl["dflash_block_attention"](*args, **kw), equations.dflash_block_attention(*args, **kw))
    H, K, gs = s.hidden, s.conv_k, s.conv_group
    x, base = _rand(g, B, H, device=device), _rand(g, K, H, scale=0.3, device=device)
    coef = _rand(g, B, 2, K, H // gs, scale=0.3, device=device)[:, 1]
    res = _rand(g, B, H, device=device)
    errors["dflash_grouped_conv"] = rel_err(impl["dflash_grouped_conv"](x, coef, base, gs, res),
                                            equations.dflash_grouped_conv(x, coef, base, gs, res))
    return errors


def lattice_case(s: Sizes, device, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    n = s.block - 1
    return dict(logits=_rand(g, n, s.vocab, scale=3, device=device), hidden=_rand(g, n, s.hidden, device=device),
                P=_rand(g, s.rank, s.hidden, scale=s.hidden**-0.5, device=device),
                A=_rand(g, s.vocab, s.rank, device=device), B=_rand(g, s.vocab, s.rank, device=device))


def check_lattice(impl: dict, s: Sizes, device, seed: int = 0) -> dict[str, float]:
    c = lattice_case(s, device, seed)
    args = (c["logits"], c["hidden"], c["P"], c["A"], c["B"], 11, s.top_k)
    cand, first, trans = impl["selector_lattice"](*args)
    r_cand, r_first, r_trans = equations.selector_lattice(*args)
    tokens = walk_compact(*readback(cand, first, trans))[0]
    r_tokens = walk_compact(*readback(r_cand, r_first, r_trans))[0]
    return {"selector_lattice.candidates": 0.0 if torch.equal(cand.cpu(), r_cand.cpu()) else float("inf"),
            "selector_lattice.first": rel_err(first, r_first), "selector_lattice.transitions": rel_err(trans, r_trans),
            "selector_lattice.walk": 0.0 if tokens == r_tokens else float("inf")}


# -- timing ----------------------------------------------------------------------------------

def median_ms(fn: Callable[[], object], device, *, reps: int = 30, warmup: int = 5) -> float:
    """Median time of ``fn`` in ms: CUDA events around each call on a GPU, a clock elsewhere."""
    for _ in range(warmup):
        fn()
    times = []
    cuda = torch.device(device).type == "cuda"
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth(device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/ms, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=F32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, reps=10, warmup=2)
    return 2 * nbytes / ms


def gdn_bytes(s: Sizes, rows: int) -> int:
    """Fewest bytes one gdn_verify moves: state in, a state per row out, the rows and window."""
    state = s.nv * s.dk * s.dv * 4
    conv_dim = 2 * s.nk * s.dk + s.nv * s.dv
    return state * (1 + rows) + 4 * conv_dim * (2 * rows + 2 * (s.conv_kernel - 1)) + 4 * rows * s.nv * s.dv


def inject_bytes(s: Sizes) -> int:
    H, n = s.hidden, s.inject_rows
    weights = 4 * (H * s.taps * H + s.d_layers * 2 * s.kv_heads * s.head_dim * H)
    return weights + 4 * n * s.taps * H + 4 * s.d_layers * n * 2 * s.kv_heads * s.head_dim


def block_bytes(s: Sizes) -> int:
    """A DFlash block's weights (float32), read once: what one draft pass must stream."""
    H, F_ = s.hidden, 3 * s.hidden
    attn = s.heads * s.head_dim * H * 2 + s.kv_heads * s.head_dim * H * 2
    return 4 * s.d_layers * (attn + 3 * H * F_)
