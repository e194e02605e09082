"""Gated DeltaNet (GDN): the recurrent mixer of most Qwen 3.5 / Qwen3-Next layers.

Per row t (one value head; S is the [dk, dv] state, kept in at least float32)::

    [q|k|v] = SiLU(causal depthwise conv over the last K rows of attn_qkv x)
    q = L2norm(q) / sqrt(dk);  k = L2norm(k)           (per key head, read by its value heads)
    beta = sigmoid(ssm_beta x);  g = ssm_a * softplus(ssm_alpha x + dt_bias)   (g <= 0)
    S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
    y = RMSNorm(o) * ssm_norm * silu(attn_gate x)  -> ssm_out

The state a rollback needs is the recurrent state S and the conv window (the last K-1 pre-conv
rows). Two forms of the recurrence:

* ``delta_rule_rows``: one row at a time. Used for plain steps and verifies; with ``slots`` it
  writes the state after EVERY row into its own slot (the per-row snapshots a verify emits),
  at no extra arithmetic: each row's state is computed in its slot. Committing slot m swaps
  that buffer with the live one: no copy of the state at all.
* with registered kernels (``DeltaNetLayer(kernels=...)``, float32 state): a verify is one
  ``gdn_verify`` launch writing a contiguous slot block and the conv window; a commit copies slot
  m into the live buffers on the device (``gdn_commit``, every layer at once); a one-row step is
  one ``gdn_step`` launch (state in place, conv state into the spare buffer, which becomes live).
* ``delta_rule_chunked``: the same recurrence for long prefills, CHUNK rows at a time. Within a
  chunk with cumulative log decay G_t and u_t the row's state correction, unrolling the rule gives
  ``(I + A) U = beta V - (beta exp(G) K) S0`` with ``A_tj = beta_t exp(G_t - G_j) k_t.k_j``
  (j < t), a unit lower-triangular solve; then ``o_t = exp(G_t) S0^T q_t + sum_{j<=t}
  exp(G_t - G_j) (q_t.k_j) u_j`` and ``S_C = exp(G_C) S0 + sum_j exp(G_C - G_j) k_j u_j^T``.
"""

from __future__ import annotations

import math
from typing import Sequence

import attrs
import torch
import torch.nn.functional as F

from .ops import exact_rows, l2_normalize, linear, rms_norm, rowwise

CHUNK = 64  # rows per block of the chunked prefill recurrence
ROWS_FORM_MAX = 16  # up to this many rows a committing forward uses the per-row recurrence


@attrs.define
class DeltaNetWeights:
    in_proj: torch.Tensor  # [conv_dim + value_dim + 2 * num_v, H]: qkv | z | beta | alpha
    conv: torch.Tensor  # [conv_dim, K] depthwise causal kernel (tap K-1 is the current row)
    dt_bias: torch.Tensor  # [num_v]
    a: torch.Tensor  # [num_v] = -exp(A_log)
    norm: torch.Tensor  # [dv] plain RMSNorm weight of the output (never +1)
    out: torch.Tensor  # [H, value_dim]
    key_index: torch.Tensor  # [num_v] long: the key head each value head reads


@attrs.define
class DeltaNetState:
    """The live recurrent state of one GDN layer for one sequence, plus the slot buffers its
    verifies write into (allocated once, reused: a verify never allocates state memory)."""

    conv: torch.Tensor  # [K-1, conv_dim] last pre-conv rows, oldest first
    ssm: torch.Tensor  # [num_v, dk, dv] in the state dtype (>= float32)
    spare: list[torch.Tensor] = attrs.field(factory=list)  # slot buffers, each like ``ssm``
    # kernel path: [R, num_v, dk, dv] slot block, [K-1+R, conv_dim] window, spare conv state
    block: torch.Tensor | None = None
    window: torch.Tensor | None = None
    conv_spare: torch.Tensor | None = None

    def kernel_buffers(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The slot block and window for a verify of ``rows`` rows (grown, never shrunk)."""
        if self.block is None or self.block.shape[0] < rows:
            self.block = self.ssm.new_empty((rows, *self.ssm.shape))
            self.window = self.conv.new_empty((self.conv.shape[0] + rows, self.conv.shape[1]))
        return self.block, self.window

    def slot_buffers(self, rows: int) -> list[torch.Tensor]:
        while len(self.spare) < rows:
            self.spare.append(torch.empty_like(self.ssm))
        return self.spare[:rows]

    def clone(self) -> "DeltaNetState":
        return DeltaNetState(self.conv.clone(), self.ssm.clone())

    def copy_from(self, other: "DeltaNetState") -> None:
        self.conv.copy_(other.conv)
        self.ssm.copy_(other.ssm)

    def zero_(self) -> None:
        self.conv.zero_()
        self.ssm.zero_()


@attrs.define
class DeltaNetSlots:
    """What a verify emits for one GDN layer: the state after every row, without touching the
    live state. Slot m's conv state is the window slice ``[m+1 : m+K]`` (a view, no copy)."""

    ssm: list[torch.Tensor]  # rows x [num_v, dk, dv]: the state's slot buffers 0..rows-1
    window: torch.Tensor  # [K-1 + rows, conv_dim] = concat(old conv state, new pre-conv rows)
    kernel: int
    block: torch.Tensor | None = None  # kernel path: the slot block ``ssm`` views
    commit_op: object = None  # kernel path: gdn_commit (slot -> live on the device)
    used: set | None = None  # the layer's record of ops that ran

    def commit_into(self, state: DeltaNetState, row: int) -> None:
        """Make slot ``row`` live. The recurrent state is not copied: the slot buffer and the
        live buffer swap roles (the old live buffer becomes a slot buffer for the next verify).
        Slots from the kernel are copied into the live buffers by ``gdn_commit`` instead."""
        if self.commit_op is not None:
            self.commit_op([self.block], [self.window], [state.ssm], [state.conv], row)
            self.used.add("gdn_commit")
            return
        index = next(i for i, buf in enumerate(state.spare) if buf is self.ssm[row])
        state.ssm, state.spare[index] = state.spare[index], state.ssm
        if self.kernel > 1:
            state.conv.copy_(self.window[row + 1 : row + self.kernel])


def delta_rule_rows(
    q: torch.Tensor,  # [rows, nv, dk] normalised and scaled
    k: torch.Tensor,  # [rows, nv, dk] normalised
    v: torch.Tensor,  # [rows, nv, dv]
    g: torch.Tensor,  # [rows, nv] log decay
    beta: torch.Tensor,  # [rows, nv]
    state: torch.Tensor,  # [nv, dk, dv] initial state (read only)
    slots: Sequence[torch.Tensor] | None = None,  # rows x [nv, dk, dv]: the state after each row
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-by-row recurrence. Returns (outputs [rows, nv, dv], final state [nv, dk, dv])."""
    rows = q.shape[0]
    out = v.new_empty(v.shape)
    s = state
    for t in range(rows):
        nxt = slots[t] if slots is not None else None
        decay = g[t].exp()[:, None, None]  # [nv, 1, 1], one row per call (see ops.rowwise)
        s = torch.mul(s, decay, out=nxt) if nxt is not None else s * decay
        kt = k[t].unsqueeze(1)  # [nv, 1, dk]
        recalled = torch.bmm(kt, s).squeeze(1)  # [nv, dv] = S^T k
        delta = (v[t] - recalled) * beta[t][:, None]  # [nv, dv]
        s.baddbmm_(kt.transpose(1, 2), delta.unsqueeze(1))  # S += k delta^T
        out[t] = torch.bmm(q[t].unsqueeze(1), s).squeeze(1)  # [nv, dv] = S^T q
    return out, s


def delta_rule_chunked(
    q: torch.Tensor,  # [T, nv, dk]
    k: torch.Tensor,  # [T, nv, dk]
    v: torch.Tensor,  # [T, nv, dv]
    g: torch.Tensor,  # [T, nv]
    beta: torch.Tensor,  # [T, nv]
    state: torch.Tensor,  # [nv, dk, dv]
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence, ``chunk`` rows at a time (see the module docstring)."""
    T = q.shape[0]
    pad = (-T) % chunk
    # padded rows have beta = 0, k = 0, g = 0: they neither read nor change the state
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    n = (T + pad) // chunk
    # -> [nv, n, C, d] / [nv, n, C]
    q, k, v = (x.permute(1, 0, 2).reshape(x.shape[1], n, chunk, x.shape[2]) for x in (q, k, v))
    g, beta = (x.t().reshape(x.shape[1], n, chunk) for x in (g, beta))
    G = g.cumsum(-1)  # [nv, n, C]
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()  # j <= t
    strict = lower.clone().fill_diagonal_(False)  # j < t
    gap = G.unsqueeze(-1) - G.unsqueeze(-2)  # [nv, n, C, C]: G_t - G_j
    decay_tj = gap.masked_fill(~lower, float("-inf")).exp()  # exp(G_t - G_j), 0 above the diagonal
    kb = k * beta.unsqueeze(-1)
    A = (kb @ k.transpose(-1, -2)) * decay_tj
    A = A.masked_fill(~strict, 0.0)
    system = A + torch.eye(chunk, dtype=A.dtype, device=A.device)
    w_v = torch.linalg.solve_triangular(system, v * beta.unsqueeze(-1), upper=False, unitriangular=True)
    w_k = torch.linalg.solve_triangular(system, kb * G.exp().unsqueeze(-1), upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay_tj  # [nv, n, C, C]
    q_decayed = q * G.exp().unsqueeze(-1)
    k_to_end = k * (G[..., -1:] - G).exp().unsqueeze(-1)
    chunk_decay = G[..., -1].exp()  # [nv, n]
    out = v.new_empty(v.shape)
    s = state
    for c in range(n):
        u = w_v[:, c] - w_k[:, c] @ s  # [nv, C, dv]
        out[:, c] = q_decayed[:, c] @ s + scores[:, c] @ u
        s = s * chunk_decay[:, c, None, None] + k_to_end[:, c].transpose(-1, -2) @ u
    out = out.reshape(out.shape[0], n * chunk, out.shape[-1])[:, :T].transpose(0, 1)
    return out, s  # [T, nv, dv], [nv, dk, dv]


class DeltaNetLayer:
    """One GDN mixer: projections, conv, recurrence and gated output norm."""

    KERNEL_OPS = ("gdn_verify", "gdn_step", "gdn_commit")

    def __init__(self, w: DeltaNetWeights, *, num_k: int, num_v: int, dk: int, dv: int, kernel: int,
                 eps: float, state_dtype: torch.dtype, kernels: dict | None = None, used: set | None = None):
        self.w = w
        self.num_k, self.num_v, self.dk, self.dv = num_k, num_v, dk, dv
        self.kernel = kernel
        self.eps = eps
        self.state_dtype = state_dtype
        self.key_dim, self.value_dim = num_k * dk, num_v * dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.splits = [self.conv_dim, self.value_dim, num_v, num_v]
        self.scale = 1.0 / math.sqrt(dk)
        # the fused ops run on a float32 state only (a float64 reference model keeps torch)
        usable = state_dtype == torch.float32 and kernels
        self.ops = {op: kernels[op] for op in self.KERNEL_OPS if usable and op in kernels}
        if "gdn_commit" not in self.ops:  # a kernel verify's slots are committed by the kernel
            self.ops.pop("gdn_verify", None)
        self.used = used if used is not None else set()
        if self.ops:  # float32 contiguous copies of the small weights the kernels read
            self._kw = tuple(t.to(torch.float32).contiguous() for t in (w.conv, w.a, w.dt_bias))

    def new_state(self, dtype: torch.dtype) -> DeltaNetState:
        device = self.w.conv.device
        conv_dtype = torch.float32 if self.ops else dtype  # the kernels keep the window in float32
        return DeltaNetState(
            torch.zeros(self.kernel - 1, self.conv_dim, dtype=conv_dtype, device=device),
            torch.zeros(self.num_v, self.dk, self.dv, dtype=self.state_dtype, device=device),
        )

    def _kernel_inputs(self, x: torch.Tensor):
        """Projections for the fused ops: (mixed, z, beta logits, alpha logits), float32."""
        mixed, z, b, a = linear(x, self.w.in_proj).split(self.splits, dim=-1)
        f32 = torch.float32
        return mixed.to(f32).contiguous(), z, b.to(f32).contiguous(), a.to(f32).contiguous()

    def _kernel_args(self) -> dict:
        return dict(num_k=self.num_k, dk=self.dk, scale=self.scale)

    def _prepare(self, x: torch.Tensor, conv_state: torch.Tensor):
        """Projections, conv and gates for rows x [rows, H] after the live conv state."""
        rows = x.shape[0]
        mixed, z, b, a = linear(x, self.w.in_proj).split(self.splits, dim=-1)
        window = torch.cat([conv_state, mixed], dim=0)  # [K-1 + rows, conv_dim]
        if rows <= ROWS_FORM_MAX:  # a few rows: the K taps as one elementwise product
            conv = (window.unfold(0, self.kernel, 1) * self.w.conv).sum(-1)  # [rows, conv_dim]
        else:
            conv = F.conv1d(window.t().unsqueeze(0), self.w.conv.unsqueeze(1), groups=self.conv_dim)
            conv = conv.squeeze(0).t()
        exact = exact_rows(self.w.in_proj)
        conv = rowwise(F.silu, conv, exact)  # [rows, conv_dim]
        sd = self.state_dtype
        qc, kc, vc = conv.to(sd).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2_normalize(qc.reshape(rows, self.num_k, self.dk)) * self.scale
        k = l2_normalize(kc.reshape(rows, self.num_k, self.dk))
        q = q.index_select(1, self.w.key_index)  # [rows, nv, dk]
        k = k.index_select(1, self.w.key_index)
        v = vc.reshape(rows, self.num_v, self.dv)
        beta = rowwise(torch.sigmoid, b.to(sd), exact)  # [rows, nv]
        a_neg, dt_bias = self.w.a.to(sd), self.w.dt_bias.to(sd)
        g = rowwise(lambda r: a_neg * F.softplus(r + dt_bias), a.to(sd), exact)  # [rows, nv]
        return q, k, v, g, beta, z, window

    def _finish(self, o: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        rows = o.shape[0]
        zh = z.reshape(rows, self.num_v, self.dv)
        y = rms_norm(o, self.w.norm.to(o.dtype), self.eps) * rowwise(F.silu, zh.to(o.dtype), exact_rows(self.w.out))
        return linear(y.reshape(rows, self.value_dim).to(dtype), self.w.out)

    def forward_commit(self, x: torch.Tensor, state: DeltaNetState) -> torch.Tensor:
        """Prefill / plain step / re-forward: advance ``state`` in place. Returns [rows, H]."""
        step = self.ops.get("gdn_step")
        if step is not None and x.shape[0] == 1:
            mixed, z, b, a = self._kernel_inputs(x)
            if state.conv_spare is None:
                state.conv_spare = torch.empty_like(state.conv)
            conv_w, a_neg, dt_bias = self._kw
            o = step(mixed, state.conv, conv_w, b, a, a_neg, dt_bias, self.w.key_index, state.ssm, state.ssm,
                     state.conv_spare, **self._kernel_args())
            state.conv, state.conv_spare = state.conv_spare, state.conv
            self.used.add("gdn_step")
            return self._finish(o, z, x.dtype)
        q, k, v, g, beta, z, window = self._prepare(x, state.conv)
        if x.shape[0] <= ROWS_FORM_MAX:
            o, s = delta_rule_rows(q, k, v, g, beta, state.ssm)
        else:
            o, s = delta_rule_chunked(q, k, v, g, beta, state.ssm)
        state.ssm.copy_(s)
        if self.kernel > 1:
            state.conv.copy_(window[window.shape[0] - (self.kernel - 1) :])
        return self._finish(o, z, x.dtype)

    def forward_slots(self, x: torch.Tensor, state: DeltaNetState) -> tuple[torch.Tensor, DeltaNetSlots]:
        """Verify: read ``state``, leave it untouched, emit the state after every row."""
        verify = self.ops.get("gdn_verify")
        if verify is not None:
            rows = x.shape[0]
            mixed, z, b, a = self._kernel_inputs(x)
            block, window = state.kernel_buffers(rows)
            conv_w, a_neg, dt_bias = self._kw
            o = verify(mixed, state.conv, conv_w, b, a, a_neg, dt_bias, self.w.key_index, state.ssm, block, window,
                       **self._kernel_args())
            self.used.add("gdn_verify")
            slots = DeltaNetSlots([block[t] for t in range(rows)], window, self.kernel, block=block,
                                  commit_op=self.ops["gdn_commit"], used=self.used)
            return self._finish(o, z, x.dtype), slots
        q, k, v, g, beta, z, window = self._prepare(x, state.conv)
        slots = state.slot_buffers(x.shape[0])
        o, _ = delta_rule_rows(q, k, v, g, beta, state.ssm, slots=slots)
        return self._finish(o, z, x.dtype), DeltaNetSlots(slots, window, self.kernel)
