"""A NextN head's forward on the compiled CPU kernels: ONE native call per head call.

The torch module (``NextNModule``) runs a head call as ~25 small torch ops; on the embedded
model that glue cost several times the arithmetic. Here the same math runs as:

    ne, nh = rms_norm(emb, enorm), rms_norm(h, hnorm)
    u      = nh @ E_h^T + (ne @ E_e^T)                         # eh_proj's two halves
    layers_forward(one-layer stack, u, KV cache, RoPE table)   # the whole decoder layer
    out    = rms_norm(u[-1], head_norm)                        # last row only
    logits = out @ head^T                                      # draft vocabulary [K]

``step`` runs all of it as one ``head_forward`` call (the head described once by ``head_new``;
the embedding rows read by slot from the shared ``EmbeddingRows`` table, in which the draft
vocabulary's rows are looked up at attach). ``forward`` + ``logits`` run the same kernels one
call each (seven calls): the reference ``step`` is held to bit for bit
(tests/test_native_head.py). How many kernel threads a call takes is measured while drafting
(``ThreadChoice``); the bits do not depend on it.

The decoder layer is described once to the kernels (``layers_new``: fused QKV and gate+up
matrices as int8 blocks, format 8, the ``BlockMatrix.quantize_int8`` copies drafting already
used), with its own KV cache in the kernels' layout ([1, kv_heads, cap, head_dim]) and its own
RoPE table ([positions, head_dim/2, (cos, sin)], the torch path's values). The kernel turns the
row at cache slot ``s`` by table row ``s``; the head's cache starts at position ``base``, so the
table is handed over from row ``base`` on and every row still turns by its absolute position.

The draft vocabulary's rows are kept in ascending target-id order (the caller sorts them), so
the compact logits' argmax breaks ties toward the lowest id, as the full-vocabulary argmax does.

Sequence views: ``for_sequence()`` makes another forward over the SAME weights (the int8
matrices, the norms, the layer-stack capsule, the embedding rows) with its own empty KV cache
and RoPE table; the capsule only describes the weights (the cache and table are handed over at
each call), so views running in different threads share it safely. ``release()`` frees a
view's cache and table (they regrow on the next call).

The numbers differ slightly from the torch module's (summation order; eh_proj in two halves);
drafts may differ, the output never does (verification decides). ``NextNFileHead`` uses this
path on the CPU when the compiled kernels are built (``available``), and the torch module
otherwise or with ``TS_MTP_NATIVE=0``.
"""

from __future__ import annotations

import copy
import statistics
import threading
import time

import torch

from tsspec.switches import switch_on

from .nextn_model import NextNModule, rope_tables

__all__ = ["NativeNextN", "ThreadChoice", "available"]

ONE_CALL_ENV = "TS_MTP_ONE_CALL"  # 0: a head call as the seven per-op kernel calls (attribution)
THREAD_CHOICE_ENV = "TS_MTP_THREAD_CHOICE"  # 0: torch's thread count, not the measured one

# the kernels' int8 flag: activation rows stay float32 (weights int8, float32 sums), the same
# arithmetic as the torch path's int8 copies, so both engines' drafts agree
HEAD_EXTENSION = "tsspec_draft_head._head_kernels"  # the head in one call; optional
INT8_ROWS = False
PREFILL_MAX_IDS = 16384  # draft vocabularies up to this size are looked up at attach (36 MiB at H=576)
EMBED_CACHE_ROWS = 4096  # token embeddings kept besides the draft vocabulary's (exact copies of the
# target's rows; 9 MiB at H=576, as many again for a 4,096-id draft vocabulary)


def layer_refusal(module: NextNModule) -> str | None:
    """Why the compiled head cannot run this layer shape (None: it can): it has no per-head
    q/k norms and multiplies by its own head rows."""
    if module.cfg.qk_norm:
        return "per-head q/k norms"
    if module.cfg.shared_head:
        return "the target's LM head as its head"
    return None


def available(module: NextNModule) -> bool:
    """True when the compiled kernels can run ``module``: built with ``layers_new``, CPU
    float32 parameters, every matrix row whole 32-weight blocks, a layer shape the kernels
    have (``layer_refusal``)."""
    from tsspec_gguf import native

    if layer_refusal(module) is not None:
        return False
    k = native.kernels()
    if k is None or not hasattr(k, "layers_new") or module.head.device.type != "cpu":
        return False
    if module.head.dtype != torch.float32:
        return False
    return all(getattr(module, name).shape[1] % 32 == 0 for name in NextNModule.PACKED)


def _q8(weight: torch.Tensor):
    """A weight [N, K] as int8 blocks (format 8, one scale per 32 weights)."""
    from tsspec_gguf.qlinear import BlockMatrix

    return BlockMatrix.quantize_int8(weight.detach())


def _f32(t: torch.Tensor) -> torch.Tensor:
    """A contiguous float32 copy the kernels may hold the address of."""
    return t.detach().to(torch.float32).contiguous()


def _describe(w) -> tuple:
    """(fmt, q, d, m, N, K, zero_m) of a BlockMatrix, as the kernels take it. zero_m vouches
    that every m is 0 (``quantize_int8``'s blocks): a one-row call then skips reading them (a
    tenth of the bytes of format 8), with the same result bit for bit."""
    zero_m = w.fmt == 8 and not bool(w.m.any())
    return (w.fmt, w.q.data_ptr(), w.d.data_ptr(), w.m.data_ptr(), w.shape[0], w.shape[1], zero_m)


class EmbeddingRows:
    """The target's embedding rows of the token ids seen so far (exact copies, looked up once),
    shared by every sequence view of one head. The table only grows: a row, once written, is
    never moved or overwritten (a lock guards the adding), so a native call may read it by slot
    while another sequence adds rows. Once it is full, ids it lacks are looked up per call."""

    def __init__(self, embed, width: int, slots: int = EMBED_CACHE_ROWS):
        self._embed = embed  # target.embed: ids -> [n, H]
        self._ids: dict[int, int] = {}  # token id -> row of _rows
        self._rows = torch.empty(slots, width)  # [slots, H]
        self._address, self._size = self._rows.data_ptr(), slots  # the shared table never moves
        self._free = 0
        self._lock = threading.Lock()

    def fill(self, tokens: list[int]) -> None:
        """Look ``tokens`` up now, in one ``embed`` call (as many as there is room for)."""
        self.slots(list(dict.fromkeys(tokens))[: self._rows.shape[0] - self._free])

    def slots(self, tokens: list[int]) -> tuple[torch.Tensor, list[int]]:
        """(a table [*, H], the row of each token in it): the shared table once every token is
        in it (rows are added, never moved or overwritten, so a slot handed out stays valid
        while another sequence adds rows), or, once the table is full, a table of this call's
        own."""
        ids = self._ids
        try:
            return self._rows, [ids[t] for t in tokens]
        except KeyError:
            pass
        with self._lock:
            missing = [t for t in dict.fromkeys(tokens) if t not in ids]
            if self._free + len(missing) <= self._rows.shape[0]:
                rows = self._embed(missing).to(torch.float32)  # [m, H]
                self._rows[self._free : self._free + len(missing)] = rows
                for i, t in enumerate(missing):  # published once the row is written
                    ids[t] = self._free + i
                self._free += len(missing)
                return self._rows, [ids[t] for t in tokens]
        return self._embed(list(tokens)).to(torch.float32).contiguous(), list(range(len(tokens)))  # [n, H]

    def addressed(self, tokens: list[int]) -> tuple[int, int, list[int], torch.Tensor | None]:
        """``slots`` for a native call: (the table's address, its rows, the slots, the table
        when it is this call's own (keep it alive through the call), else None)."""
        ids = self._ids
        try:
            return self._address, self._size, [ids[t] for t in tokens], None
        except KeyError:
            pass
        table, slots = self.slots(tokens)
        if table is self._rows:
            return self._address, self._size, slots, None
        return table.data_ptr(), table.shape[0], slots, table

    def __call__(self, tokens: list[int]) -> torch.Tensor:
        """[n, H] float32, a tensor of the caller's own."""
        table, slots = self.slots(tokens)
        return table[slots]  # [n, H] (indexing copies)


class ThreadChoice:
    """How many kernel threads a head call runs on: measured while drafting, not assumed.

    A head call is small (on the embedded model ~1/20 of a target step): split over two threads
    it may finish sooner (two cores pulling its weights, cold after the target's step, from
    memory) or later (the second thread must be woken, and on a busy machine it may wait for a
    core). Which one wins depends on the machine and its load, so each round times
    ``TRIALS`` calls per candidate (1 and torch's thread count, alternating) and keeps the
    lower median until the next round, ``EVERY`` calls later. Drafts do not depend on it: the
    kernels give the same bits on any thread count (tests/test_native_head.py, on the
    embedded model's real rows)."""

    TRIALS = 8  # timed calls per candidate in a round
    EVERY = 512  # calls between rounds (the machine's load changes)

    def __init__(self):
        self._best = 0  # 0: not chosen yet
        self._times: dict[int, list[int]] = {}
        self._calls = 0  # calls since the round ended
        self._lock = threading.Lock()  # sequence views in other threads pick and record too

    def pick(self, most: int) -> tuple[int, bool]:
        """(threads for this call, whether to time it); ``most``: torch's thread count."""
        if most <= 1:
            return 1, False
        with self._lock:
            if self._best and self._calls < self.EVERY:
                self._calls += 1
                return self._best, False
            candidates = (1, most)
            done = sum(len(self._times.get(c, ())) for c in candidates)
            return candidates[done % 2], True

    def record(self, threads: int, ns: int, most: int) -> None:
        """The wall time of a timed call; ends the round when every candidate has its trials."""
        candidates = (1, most)
        with self._lock:
            times = self._times
            times.setdefault(threads, []).append(ns)
            if all(len(times.get(c, ())) >= self.TRIALS for c in candidates):
                self._best = min(candidates, key=lambda c: (statistics.median(times[c]), c))
                self._times, self._calls = {}, 0

    @property
    def chosen(self) -> int:
        """The thread count of the last round (0: none finished yet)."""
        return self._best


class NativeNextN:
    """The compiled forward of one ``NextNModule`` with its own KV cache (see the module
    docstring). ``forward`` feeds rows at cache slots ``at..`` and returns the head's output rows
    it was asked for; ``logits`` maps one output row to draft-vocabulary logits [K];
    ``for_sequence`` makes another over the same weights with a cache of its own."""

    def __init__(self, module: NextNModule, embed, *, threads: int | None = None):
        from tsspec_gguf import native
        from tsspec_gguf.qlinear import BlockMatrix

        self._k = native.kernels()
        self._h = native.extension(HEAD_EXTENSION)  # head_new, head_forward (csrc/head.c)
        cfg = module.cfg
        self.cfg = cfg
        self.H = H = cfg.hidden_size
        self.threads = threads  # None: chosen by measuring (ThreadChoice), up to torch's thread count
        self.thread_choice = ThreadChoice() if switch_on(THREAD_CHOICE_ENV) else None  # shared with the views
        self.one_call = switch_on(ONE_CALL_ENV)  # False: step runs the seven per-op calls (attribution)
        if self._h is None:  # the extension did not build: the per-op calls, the same values
            native.warn_missing_extension(HEAD_EXTENSION, "the draft head's call (seven kernel calls)")
            self.one_call = False
        eh = module.eh_proj.detach()  # [H, 2H]: columns 0..H-1 read norm(emb), H.. read norm(h)
        self._e_emb, self._e_hid = _q8(eh[:, :H].contiguous()), _q8(eh[:, H:].contiguous())
        self._head = _q8(module.head)  # [K, H]
        self._layer = (
            # the kernels' attention takes the 1/sqrt(hd) scale folded into the Q rows (as the
            # llama loader does; exact when hd is a power of 4)
            BlockMatrix.concat(  # [q + 2 kv, H]
                [_q8(module.wq).scaled(cfg.head_dim**-0.5), _q8(module.wk), _q8(module.wv)]),
            _q8(module.wo),  # [H, q]
            BlockMatrix.concat([_q8(module.w_gate), _q8(module.w_up)]),  # [2F, H]
            _q8(module.w_down),  # [H, F]
        )
        self._enorm, self._hnorm, self._head_norm = _f32(module.enorm), _f32(module.hnorm), _f32(module.head_norm)
        self._attn_norm, self._ffn_norm = _f32(module.attn_norm), _f32(module.ffn_norm)
        dims = (H, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim, cfg.intermediate_size,
                float(cfg.rms_eps))
        layer = (self._attn_norm.data_ptr(), 0, 0, self._ffn_norm.data_ptr(), *map(_describe, self._layer))
        self._stack = self._k.layers_new(dims, [layer])  # holds addresses: the tensors above stay alive
        norms = (self._enorm.data_ptr(), self._hnorm.data_ptr(), self._head_norm.data_ptr())
        self._desc = None if self._h is None else self._h.head_new(self._stack, float(cfg.rms_eps), norms, _describe(self._e_emb),
                                      _describe(self._e_hid), _describe(self._head), INT8_ROWS)  # the whole call
        # shared with the views. The draft vocabulary's rows are looked up now, in one call
        # (most tokens a head is fed are ones it can propose): in generation a new token's
        # lookup would cost a target.embed call (~0.16 ms) inside that step's draft phase
        # (a full-vocabulary head's ids are not prefilled: its table would take vocab x H floats)
        draft_ids = module.draft_ids.tolist()  # [K]
        prefill = draft_ids if len(draft_ids) <= PREFILL_MAX_IDS else []
        self.embeddings = EmbeddingRows(embed, H, EMBED_CACHE_ROWS + len(prefill))
        self.embeddings.fill(prefill)
        self.release()

    def for_sequence(self) -> "NativeNextN":
        """A forward over the same weights, layer stack and embedding rows (nothing is copied)
        with its own empty KV cache and RoPE table: one per sequence."""
        view = copy.copy(self)  # shallow: every weight tensor and the capsule are shared
        view.release()
        return view

    def release(self) -> None:
        """Drop the KV cache and the RoPE table (they regrow on the next call); the view's
        output buffers are its own from here on."""
        cfg = self.cfg
        self._kc = torch.zeros(1, cfg.num_kv_heads, 0, cfg.head_dim)  # [1, nkv, cap, hd]
        self._vc = torch.zeros(1, cfg.num_kv_heads, 0, cfg.head_dim)
        self._kv = (self._kc.data_ptr(), self._vc.data_ptr(), 0)  # (k, v addresses, capacity): step_gated's
        self._rope = torch.zeros(0, cfg.head_dim // 2, 2)  # [positions, hd/2, (cos, sin)]
        self._rope_rows, self._rope_at = 0, 0  # the table's positions and address
        self._rope_row_bytes = (cfg.head_dim // 2) * 2 * 4
        # step_gated's outputs, written in place (no tensor made per call): the logits [K] and
        # two output rows [2, H] taken in turn, so the row a call returns stays valid through
        # the next call (which reads it as its predecessor row)
        self._gate_logits = torch.empty(self._head.shape[0])  # [K]
        self._gate_logits_at = self._gate_logits.data_ptr()
        outs = torch.empty(2, self.H)  # [2, H]
        self._gate_outs = [(row, row.data_ptr()) for row in outs.unbind(0)]  # each ([H], its address)
        self._gate_turn = 0

    @property
    def capacity(self) -> int:
        return self._kc.shape[2]

    # -- growing -----------------------------------------------------------------------------
    def ensure(self, slots: int, max_slots: int) -> None:
        """Room for ``slots`` cache slots (kept rows copied over); at most ``max_slots`` unless
        more are asked for."""
        cap = self.capacity
        if slots <= cap:
            return
        new = min(max(slots, 2 * cap, 256), max(slots, max_slots))
        for name in ("_kc", "_vc"):
            old = getattr(self, name)
            grown = torch.zeros(1, old.shape[1], new, old.shape[3])
            grown[:, :, :cap] = old
            setattr(self, name, grown)
        self._kv = (self._kc.data_ptr(), self._vc.data_ptr(), new)

    def _rope_from(self, base: int, positions: int) -> int:
        """The address of table row ``base`` of a table covering ``positions`` positions."""
        if positions > self._rope_rows:
            size = max(positions, 2 * self._rope.shape[0], 512)
            cos, sin = rope_tables(torch.arange(size), self.cfg.head_dim, self.cfg.rope_theta)  # [size, 1, hd/2]
            self._rope = torch.stack([cos[:, 0], sin[:, 0]], dim=-1).contiguous()  # [size, hd/2, 2]
            self._rope_rows, self._rope_at = size, self._rope.data_ptr()
        return self._rope_at + base * self._rope_row_bytes

    # -- running -----------------------------------------------------------------------------
    def forward(self, tokens: list[int], h_rows: torch.Tensor, at: int, base: int, *, want_last: bool):
        """The per-op reference of ``step`` (seven kernel calls). Feed ``tokens`` with their predecessor rows ``h_rows`` [n, H] at cache slots
        ``at..at+n-1`` (position ``base + slot``); the cache must hold ``at + n`` slots
        (``ensure``). Returns the head's output for the last row ([H], after head_norm) when
        ``want_last``, else None."""
        k, H = self._k, self.H
        n = len(tokens)
        threads = self.threads or torch.get_num_threads()
        eps = float(self.cfg.rms_eps)
        emb = self.embeddings(tokens)  # [n, H]
        h = h_rows.to(torch.float32).contiguous()  # [n, H]
        normed = torch.empty(2, n, H)  # [(emb, h), n, H]
        k.rms_norm(emb.data_ptr(), self._enorm.data_ptr(), normed[0].data_ptr(), n, H, eps)
        k.rms_norm(h.data_ptr(), self._hnorm.data_ptr(), normed[1].data_ptr(), n, H, eps)
        u = torch.empty(n, H)  # [n, H]: the residual stream through the layer
        e, g = self._e_emb, self._e_hid
        k.gemm(e.fmt, e.q.data_ptr(), e.d.data_ptr(), e.m.data_ptr(), H, H, normed[0].data_ptr(), n,
               u.data_ptr(), 0, threads, INT8_ROWS)
        k.gemm(g.fmt, g.q.data_ptr(), g.d.data_ptr(), g.m.data_ptr(), H, H, normed[1].data_ptr(), n,
               u.data_ptr(), u.data_ptr(), threads, INT8_ROWS)
        table = self._rope_from(base, base + at + n)
        k.layers_forward(self._stack, 0, 1, u.data_ptr(), n, at, self._kc.data_ptr(), self._vc.data_ptr(),
                         self.capacity, table, threads, INT8_ROWS)
        if not want_last:
            return None
        out = torch.empty(H)  # [H]: returned (chained as the next step's h), so never reused
        k.rms_norm(u[n - 1].data_ptr(), self._head_norm.data_ptr(), out.data_ptr(), 1, H, eps)
        return out

    def step(self, tokens: list[int], h_rows: torch.Tensor, at: int, base: int, *, want_last: bool):
        """What ``forward`` and then ``logits`` compute, bit for bit, in ONE native call
        (``head_forward``: the same kernels in the same order): (the last row's output [H],
        its draft-vocabulary logits [K]) when ``want_last``, else (None, None)."""
        if not self.one_call:
            out = self.forward(tokens, h_rows, at, base, want_last=want_last)
            return (out, self.logits(out)) if want_last else (None, None)
        n = len(tokens)
        table, slots = self.embeddings.slots(tokens)
        h = h_rows if h_rows.dtype == torch.float32 and h_rows.is_contiguous() else h_rows.to(torch.float32).contiguous()
        rope = self._rope_from(base, base + at + n)
        out = logits = None
        out_at = logits_at = 0
        if want_last:
            out, logits = torch.empty(self.H), torch.empty(self._head.shape[0])  # [H], [K]: the caller's to keep
            out_at, logits_at = out.data_ptr(), logits.data_ptr()
        most = torch.get_num_threads()
        if self.threads or self.thread_choice is None:
            threads, timed = self.threads or most, False
        else:
            threads, timed = self.thread_choice.pick(most)
        start = time.perf_counter_ns() if timed else 0
        self._h.head_forward(self._desc, table.data_ptr(), table.shape[0], slots, h.data_ptr(), at, self._kc.data_ptr(),
                             self._vc.data_ptr(), self.capacity, rope, threads, out_at, logits_at)
        if timed:
            self.thread_choice.record(threads, time.perf_counter_ns() - start, most)
        return out, logits

    def step_gated(self, tokens: list[int], h_rows: torch.Tensor | None, at: int, base: int, cut: int, top_k: int,
                   last: torch.Tensor | None = None):
        """``step`` with the draft-head gate in the same native call: (the index of the top-1
        among the first ``cut`` draft-vocabulary logits, its probability over their ``top_k``
        largest, the last row's output [H]), the index and probability bit for bit what
        ``confidence.top1_over_topk`` gives on ``step``'s logits[:cut]. The predecessor rows:
        ``h_rows`` [n, H]; or, with ``last`` (the last token's [H]), the other tokens' rows are
        ``h_rows``' first n - 1 (it may hold more: a buffer; None when n is 1), read in place.
        Both float32 and contiguous (the caller checks). Nothing is allocated: the logits stay
        in the view's buffer, and the output row is one of two the view takes in turn, valid
        until the call after next (so the next call may read it as its predecessor row); copy
        it to keep it longer."""
        n = len(tokens)
        rows = self.embeddings
        ids, own = rows._ids, None
        try:  # EmbeddingRows.addressed's common case, inline: every token already in the shared table
            table_at, table_rows, slots = rows._address, rows._size, [ids[t] for t in tokens]
        except KeyError:
            table_at, table_rows, slots, own = rows.addressed(tokens)
        end = base + at + n
        rope = self._rope_at + base * self._rope_row_bytes if end <= self._rope_rows else self._rope_from(base, end)
        turn = self._gate_turn = 1 - self._gate_turn
        out, out_at = self._gate_outs[turn]
        kc, vc, cap = self._kv
        most = torch.get_num_threads()
        choice = self.thread_choice
        if self.threads or choice is None:
            threads, timed = self.threads or most, False
        else:
            threads, timed = choice.pick(most)
        start = time.perf_counter_ns() if timed else 0
        gate = self._h.head_forward(self._desc, table_at, table_rows, slots, 0 if h_rows is None else h_rows.data_ptr(),
                                    at, kc, vc, cap, rope, threads, out_at, self._gate_logits_at, cut, top_k,
                                    0 if last is None else last.data_ptr())
        if timed:
            choice.record(threads, time.perf_counter_ns() - start, most)
        del own  # this call's own embedding table (a full shared one) lived through the call
        if gate is None:  # a NaN or a maximum that is not finite: the reference gate decides
            from .confidence import top1_over_topk_torch

            gate = top1_over_topk_torch(self._gate_logits[:cut], top_k)
        return gate[0], gate[1], out

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [K] of one output row [H]."""
        w = self._head
        res = torch.empty(w.shape[0])  # [K]
        self._k.gemm(w.fmt, w.q.data_ptr(), w.d.data_ptr(), w.m.data_ptr(), w.shape[0], w.shape[1],
                     out.data_ptr(), 1, res.data_ptr(), 0, self.threads or torch.get_num_threads(), INT8_ROWS)
        return res
