"""``LlamaTarget``: a dense transformer of a family in ``families.py`` as a ``tsspec`` SpeculativeTarget.

A family whose block is not llama's (per-head Q/K norms, post norms, GELU-tanh, sliding
windows, soft-capping) runs ``_family_block`` on the same per-row kernels (or torch ops off
the kernel path); on the kernel path its blocks, except soft-capped ones, also run as one
native call (the step extension's ``family_new`` stack, bit for bit ``_family_block``), as a
llama block runs on the fused native stack below.

Block: ``x += W_o attn(rope(q), rope(k), v)`` on ``RMSNorm(x)``, then
``x += W_down (silu(W_gate h) * W_up h)`` on ``RMSNorm(x)``; final RMSNorm; LM head (the
embedding when the file has no ``output.weight``).

Two paths run a block. On the CPU in float32 (the default) ``_kernel_block`` runs it on the
compiled kernels (``tsspec_gguf``: block matmuls on the file's quantised weights, causal
attention, RMSNorm, RoPE, SiLU product), each computing a row the same way whatever the row
count, so a k-row verify reproduces the 1-row decode's logits bit for bit. Calls of up to
``GEMM_ROWS`` rows (decode, verify) run all blocks in one native call (``layers_forward`` on
a layer stack described once at load; bit for bit ``_kernel_block``, which stays for long
prefills, dense matrices and ``fused_blocks = False``; the paged serving path keeps the per-op
calls). Elsewhere (CUDA,
bf16/f16, the float64 reference mode, a build without the kernels) ``_block`` uses torch ops.

Torch attention is GQA without copying the cache per step: the KV cache is [n_kv, capacity, hd]
per layer and the queries of the ``group`` heads that share a KV head are stacked as extra query
rows of that KV head, ``q [n_kv, group * rows, hd]``, so two batched matmuls serve all heads.
A multi-row call (prefill, verify) masks causally with the cache offset: row t sees keys
``0 .. past + t``.

KV cache: pre-allocated and grown geometrically (``spec_ensure_capacity``); a rejected draft
tail is dropped by ``spec_rewind_cache`` (the slots are simply overwritten later), so the
target has no recurrent state: ``spec_keep`` only sets the length.

Drafter-facing surface (DFlash-style block drafters and per-token heads borrow these):

* ``embed(token_ids) -> [n, H]``: the raw token embedding.
* ``final_norm(h [n, H]) -> [n, H]``: the last RMSNorm.
* ``lm_head(h [n, H]) -> [n, vocab]``: the output projection; it does NOT apply the final norm.
* ``spec_set_feature_taps(layers)``: hidden rows become the residuals entering those layers,
  concatenated (``layers`` may include ``n_layers``: the residual after the last layer).

All three return float32 on the CPU, like ``spec_forward``'s logits and hidden rows.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from tsspec.errors import GenerationError
from tsspec_gguf import native
from tsspec_gguf.attention import causal_attention
from tsspec_gguf.qlinear import BF16, F16, GEMM_ROWS, BlockMatrix
from tsspec_gguf.rowops import TORCH_SERIAL_VALUES, torch_norm_lanes
from tsspec.protocols import ModelConfig, resolve_feature_taps

from .hparams import LlamaHParams
from .rope import RotaryTable
from .weights import SERVED_KEY, residual_dtype

INITIAL_CAPACITY = 256  # KV slots allocated on first use; grown by doubling
SMALL_OP_ROWS = 16  # calls of up to this many rows (decode, verify) run small ops on one thread
OUTPUT_DEVICE = torch.device("cpu")
STEP_EXTENSION = "tsspec_model_llama._step_kernels"  # the fused step (csrc/step.c), optional



def _linear(h: torch.Tensor, weight, bias: torch.Tensor | None = None, precision: str = "float32") -> torch.Tensor:
    """h [rows, in] @ weight^T (+ bias) for a dense weight or a BlockMatrix (``precision``: the
    block kernel's arithmetic, see tsspec_gguf.qlinear)."""
    if isinstance(weight, BlockMatrix):
        out = weight.linear(h, precision=precision)
        return out if bias is None else out.add_(bias)
    return F.linear(h, weight, bias)


def _embedding(ids: torch.Tensor, table) -> torch.Tensor:
    """Rows of the embedding table (dense or BlockMatrix) -> [n, H]."""
    return table.rows(ids) if isinstance(table, BlockMatrix) else F.embedding(ids, table)


def _describe(w: BlockMatrix, kernels) -> tuple:
    """A block matrix as the compiled kernels take it, (fmt, q, d, m, N, K), and for a build with
    the ``zero_m`` switch whether every m is 0 (format 8 from Q8_0: its decode rows then read no
    m; a build without the switch takes the six items)."""
    plain = (w.fmt, w.q.data_ptr(), w.d.data_ptr(), w.m.data_ptr(), w.shape[0], w.shape[1])
    if not hasattr(kernels, "set_zero_m"):
        return plain
    return (*plain, w.fmt == 8 and not bool(w.m.any()))


HALF_NAMES = {F16: "F16", BF16: "BF16"}


class _Layer:
    """One block's prepared tensors (plain attributes: the hot loop reads them directly)."""

    __slots__ = ("attn_norm", "wqkv", "bqkv", "wo", "bo", "ffn_norm", "w_gate_up", "w_down",
                 "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")

    def __init__(self, weights: dict[str, torch.Tensor], i: int, device: torch.device):
        def get(name):
            t = weights.get(f"l{i}.{name}")
            return t if t is None or isinstance(t, BlockMatrix) else t.to(device)

        self.attn_norm = get("attn_norm")
        self.wqkv = get("wqkv")
        self.bqkv = get("bqkv")
        self.wo = get("wo")
        self.bo = get("bo")
        self.ffn_norm = get("ffn_norm")
        self.w_gate_up = get("w_gate_up")
        self.w_down = get("w_down")
        self.q_norm = get("q_norm")  # [hd], the attention scale folded in
        self.k_norm = get("k_norm")
        self.post_attn_norm = get("post_attn_norm")
        self.post_ffn_norm = get("post_ffn_norm")


class LlamaTarget:
    """See the module docstring. Build it with ``tsspec_model_llama.load_llama``."""

    speculation_profitable = True
    speculation_refusal: str | None = None
    spec_preferred_draft_window: int | None = None
    spec_verify_persists_accepted_kv = True
    # In calls of up to SMALL_OP_ROWS rows, run the small per-layer ops (norms, RoPE, attention)
    # on one thread and only the weight GEMMs on torch's thread count: torch parallelises even a [3, 3, 64] bmm,
    # and two OpenMP threads that wait on each other at every such barrier are 10-1000x slower
    # than one thread whenever another process holds a core (measured on shared 2-core boxes).
    small_ops_single_thread = True
    # On the kernel path, calls of up to GEMM_ROWS rows run every block in one native call
    # (``layers_forward``: bit for bit the per-op ``_kernel_block``); False keeps the per-op path.
    fused_blocks = True
    # ... and, with no feature taps, the whole step in one (``model_step``: the embedding rows,
    # the blocks, the final norm in torch's own order and the LM head; the same logits bit for
    # bit); False keeps the embedding, final norm and LM head as separate calls from Python.
    native_step = True

    def __init__(
        self,
        hparams: LlamaHParams,
        weights: dict[str, torch.Tensor],
        *,
        tokenizer=None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        path: str | None = None,
        load_seconds: float | None = None,
        cache_hit: bool | None = None,
        precision: str = "float32",
        chat_template_note: str | None = None,
    ):
        self.hparams = hp = hparams
        # the one-line note when chats use the family's built-in template (the file has none)
        self.chat_template_note = chat_template_note
        self.path = path
        self.device = torch.device(device)
        self.dtype = dtype
        self.tokenizer = tokenizer
        self.draft_head = None
        self.load_seconds = load_seconds
        self.cache_hit = cache_hit
        weights = dict(weights)
        # ggml type -> (matrix tensors in blocks, as float32 weights)
        self.served_formats: dict[str, tuple[int, int]] = dict(weights.pop(SERVED_KEY, None) or {})
        # a block is llama's (the fused native stack runs it) unless the family adds to it
        self._llama_block = hp.family.llama_block
        tied = "lm_head" not in weights
        # weights kept in quantised blocks (CPU): every matmul row is summed in the same order
        # whatever the row count, and short verifies need no padding (see qlinear.py)
        self.block_weights = any(isinstance(t, BlockMatrix) for t in weights.values())
        # 16-bit float matrices (F16 / BF16 files, --dtype float16 / bfloat16): kept at 16 bits
        self._halves = halves = sorted({HALF_NAMES[t.fmt] for t in weights.values()
                                        if isinstance(t, BlockMatrix) and t.fmt in HALF_NAMES})
        # the block kernel's arithmetic: float32 (exact weights, float32 sums) or int8 (rows
        # quantised per 32 values, exact integer dots: llama.cpp's); both batch-invariant
        self.precision = precision if self.block_weights else str(dtype).removeprefix("torch.")
        self.config = ModelConfig(
            architecture=hp.architecture,
            vocab_size=hp.vocab_size,
            hidden_size=hp.hidden_size,
            num_layers=hp.n_layers,
            context_length=hp.context_length,
            extra={
                **hp.as_extra(),
                "tied_embeddings": tied,
                "dtype": str(dtype).removeprefix("torch."),
                "weights": ("blocks" + (f" ({', '.join(halves)} weights kept at 16 bits)" if halves else ""))
                if self.block_weights else "dense",
                "weight_formats": self.weight_formats(),
                "arithmetic": self.precision,
                "lossless": self._guarantee(),
                "chat_template": self._chat_template_origin(tokenizer, hp, chat_template_note),
            },
        )
        # the residual stream, norms, RoPE and attention (KV cache included) run in float32;
        # only the weight matmuls use ``dtype`` (bf16 / f16 halve the bytes a step reads)
        self._residual_dtype = residual_dtype(dtype)
        self._cast = self._residual_dtype != dtype
        place = lambda t: t if isinstance(t, BlockMatrix) else t.to(self.device)  # noqa: E731
        self._embed = place(weights["embed"])
        self._lm_head = self._embed if tied else place(weights["lm_head"])
        # the compiled kernels run the whole block (CPU, float32; None elsewhere or when not
        # built): each row is computed the same way whatever the row count, so verify rows
        # reproduce decode rows bit for bit
        self._kernels = native.kernels() if self.device.type == "cpu" and dtype == torch.float32 else None
        self._rope_table = 0  # address of the RoPE (cos, sin) table, refreshed per forward
        self._output_norm = weights["output_norm"].to(self.device)
        self._layers = [_Layer(weights, i, self.device) for i in range(hp.n_layers)]
        self._rope = RotaryTable(
            hp.rope_dim,
            hp.rope_base,
            linear_factor=hp.rope_linear_factor,
            freq_factors=weights.get("rope_freqs"),
            device=self.device,
            dtype=self._residual_dtype,
        )
        self._rope_local = self._rope
        if any(hp.sliding(i) for i in range(hp.n_layers)) and hp.rope_base_local != hp.rope_base:
            # sliding layers: their own base, no frequency scaling (llama.cpp's and HF's rule)
            self._rope_local = RotaryTable(hp.rope_dim, hp.rope_base_local, device=self.device,
                                           dtype=self._residual_dtype)
        self._embed_scale = (torch.tensor(hp.hidden_size**0.5, dtype=self._residual_dtype, device=self.device)
                             if hp.family.embedding_scale else None)
        self._eps = hp.rms_eps
        self._step_kernels = native.extension(STEP_EXTENSION) if self._kernels is not None else None
        self._family_stack = False  # True: self._stack is the step extension's family stack
        self._stack = self._layer_stack()
        self._step_head = self._native_head()
        # the weights every step streams on 2 MiB pages where the system allows it: a TLB miss
        # every 2 MiB of the stream instead of every 4 KiB (the same bytes, no value changes)
        self.huge_page_bytes = self._weights_on_huge_pages()
        self._norm_shape = (hp.hidden_size,)
        self._qk_heads = hp.n_heads + hp.n_kv_heads
        self._qk_size = self._qk_heads * hp.head_dim
        self._seq_len = 0
        self._last_forward = (0, 0)  # (start, rows) of the last spec_forward, for spec_keep
        self._capacity = 0
        self._k: torch.Tensor | None = None  # [layers, n_kv, capacity, hd]
        self._v: torch.Tensor | None = None
        self._taps: tuple[int, ...] | None = None
        self._row_ms = None  # the forward's cost by rows, measured on first use
        self._context_limit = 0  # -c/--ctx-size (0: the file's context_length)
        self._gemm_threads = self._small_threads = self._active_threads = torch.get_num_threads()

    def _guarantee(self) -> str:
        """The lossless guarantee of this path, one line (docs/lossless.md lists every path)."""
        if self.block_weights and native.available() and self.device.type == "cpu":
            halves = f"; {', '.join(self._halves)} weights kept at 16 bits, float32 math" if self._halves else ""
            return f"bit-exact: block-kernel rows are batch-invariant (verify rows equal one-row decode){halves}"
        if self.dtype == torch.float64:
            return "equal to plain up to float64 rounding (verify rows agree to ~1e-15)"
        if self.dtype == torch.float32:
            return ("not bit-exact: torch's dense GEMM rounds verify rows differently; "
                    "output equals plain except at a near-tie")
        return (f"not bit-exact: torch's {str(self.dtype).removeprefix('torch.')} GEMM moves verify-row logits "
                "by tenths; seeded sampling can differ from plain, greedy at close calls")

    def _layer_stack(self):
        """The blocks described once to the compiled kernels (a capsule of the weights'
        addresses: ``self._layers`` keeps the tensors alive), or None when a matrix is dense or
        the kernels are off."""
        k, hp = self._kernels, self.hparams
        if k is None or not self.block_weights or not hasattr(k, "layers_new"):
            return None
        matrices = [(layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down) for layer in self._layers]
        if not all(isinstance(w, BlockMatrix) for ws in matrices for w in ws):
            return None
        if not self._llama_block:
            return self._new_family_stack(matrices)

        def describe(w: BlockMatrix):
            return _describe(w, k)

        def address(t):
            return 0 if t is None else t.contiguous().data_ptr()

        for layer in self._layers:  # the capsule holds addresses: keep contiguous float32 copies
            for name in ("attn_norm", "ffn_norm", "bqkv", "bo"):
                t = getattr(layer, name)
                if t is not None:
                    setattr(layer, name, t.to(torch.float32).contiguous())
        dims = (hp.hidden_size, hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.rope_dim, hp.ffn_size, self._eps)
        layers = [
            (address(layer.attn_norm), address(layer.bqkv), address(layer.bo), address(layer.ffn_norm), *map(describe, ws))
            for layer, ws in zip(self._layers, matrices)
        ]
        return k.layers_new(dims, layers)

    def _new_family_stack(self, matrices):
        """A family's blocks described once to the step extension (``family_new``), or None
        where its block cannot run there (soft-capped scores or logits, no extension)."""
        hp, step = self.hparams, self._step_kernels
        if hp.attn_softcap or hp.final_softcap:
            return None
        if step is None or not hasattr(step, "family_new"):
            native.warn_missing_extension(STEP_EXTENSION, f"{hp.architecture}'s blocks (the per-op path)")
            return None
        names = ("attn_norm", "bqkv", "bo", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")
        for layer in self._layers:  # the capsule holds addresses: keep contiguous float32 copies
            for name in names:
                t = getattr(layer, name)
                if t is not None:
                    setattr(layer, name, t.to(torch.float32).contiguous())
        scale = float(self._embed_scale) if self._embed_scale is not None else 0.0
        dims = (hp.hidden_size, hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.rope_dim, hp.ffn_size, self._eps,
                scale, hp.family.activation == "gelu_tanh")
        layers = [
            (*(0 if getattr(layer, n) is None else getattr(layer, n).data_ptr() for n in names),
             hp.sliding_window if hp.sliding(i) else 0, *(_describe(w, self._kernels) for w in ws))
            for i, (layer, ws) in enumerate(zip(self._layers, matrices))
        ]
        self._family_stack = True
        return step.family_new(dims, layers)

    def _rope_tables(self, positions: int):
        """The RoPE table address(es) a native stack call takes: the global one, or for a family
        stack (global, sliding layers')."""
        table = self._rope.address(positions)
        return (table, self._rope_local.address(positions)) if self._family_stack else table

    def _weights_on_huge_pages(self) -> int:
        """Bytes of the block weights now on huge pages (``native.huge_pages``); 0 off the
        kernel path."""
        if self._kernels is None or not self.block_weights:
            return 0
        matrices = [self._embed, self._lm_head]
        matrices += [w for layer in self._layers for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)]
        return native.huge_pages(t for w in matrices if isinstance(w, BlockMatrix) for t in (w.q, w.d, w.m))

    def _native_head(self):
        """(embedding, LM head, norm lanes) for ``model_step``, or None where a step cannot run
        in one native call bit for bit: no layer stack, a dense embedding or LM head, or a
        torch whose final RMSNorm the kernels do not reproduce on this CPU (``torch_norm_lanes``)."""
        if self._stack is None:
            return None
        step = self._step_kernels
        if step is None:
            native.warn_missing_extension(STEP_EXTENSION, "llama's decode step (the per-stack path)")
            return None
        if not (isinstance(self._embed, BlockMatrix) and isinstance(self._lm_head, BlockMatrix)):
            return None
        lanes = torch_norm_lanes(self.hparams.hidden_size, self._eps)
        if lanes is None:
            return None
        self._output_norm = self._output_norm.to(torch.float32).contiguous()  # the call holds its address
        # the residual rows and the normed rows of a call that returns no hidden rows: scratch
        # the target keeps (no tensor is made for them per step), [2 * GEMM_ROWS, H]
        self._step_work = torch.empty((2 * GEMM_ROWS, self.hparams.hidden_size), dtype=torch.float32)
        return (_describe(self._embed, self._kernels), _describe(self._lm_head, self._kernels), lanes,
                self._output_norm.data_ptr(), self._step_work.data_ptr())

    def _step_in_one_call(self, tokens: Sequence[int], all_logits_rows: bool, want_hidden: bool):
        """``spec_forward`` in one native call (``model_step``): (logits, hidden), or None when
        this call needs the Python path (final-norm hidden rows of several positions without
        every row's logits, more rows than the kernel path or torch's serial norm covers). A
        one-row step keeps its only row's logits either way, so it takes the one call with or
        without hidden rows (a plain step while a learned drafter is armed or parked). With
        feature taps the hidden rows are the tapped residuals, which the call copies out as the
        blocks pass them, for every row whatever the logits kept (a block drafter's verify)."""
        rows = len(tokens)
        kept = rows if all_logits_rows else 1
        hp = self.hparams
        taps = self._taps
        if (self._step_head is None or not self.native_step or not self.fused_blocks
                or (taps is not None and self._family_stack)
                or (want_hidden and taps is None and kept < rows) or not 1 <= rows <= GEMM_ROWS
                or kept * hp.hidden_size >= TORCH_SERIAL_VALUES):
            return None
        ids = [int(t) for t in tokens]
        if min(ids) < 0 or max(ids) >= hp.vocab_size:
            raise ValueError(f"token ids must lie in [0, {hp.vocab_size})")
        past = self._seq_len
        if past + rows > self._capacity:
            self.spec_ensure_capacity(past + rows)
        threads = self._gemm_threads = self._active_threads = torch.get_num_threads()
        table = self._rope_tables(past + rows)  # [pos, half, 2]
        embed, lm_head, lanes, norm_weight, work = self._step_head
        # (the first torch op after a step's weight stream runs on cold caches: one a step here)
        logits = torch.empty((kept, hp.vocab_size), dtype=torch.float32)
        tapped = torch.empty((rows, len(taps) * hp.hidden_size), dtype=torch.float32) if want_hidden and taps else None
        normed = torch.empty((kept, hp.hidden_size), dtype=torch.float32) if want_hidden and not taps else None
        normed_at = work + rows * hp.hidden_size * 4 if normed is None else normed.data_ptr()  # bytes
        head = (norm_weight, self._eps, lanes, normed_at, rows - kept, lm_head, logits.data_ptr())
        taps_arg = () if tapped is None else ((taps, tapped.data_ptr()),)  # (older builds take no taps)
        self._step_kernels.model_step(
            self._stack, ids, embed, work, past, *self._kv_addresses, self._capacity, table, threads,
            self.precision == "int8", head, *taps_arg,
        )
        self._seq_len = past + rows
        return logits, (normed if tapped is None else tapped)

    def _fused_blocks(self, x: torch.Tensor, past: int, taps, tapped: dict) -> torch.Tensor:
        """Every block on the compiled kernels in one call per stretch between feature taps
        (x [rows, H] float32 is updated in place; a tapped residual is kept as a copy)."""
        stops = sorted({t for t in taps or () if 0 < t < self.hparams.n_layers} | {self.hparams.n_layers})
        start = 0
        if taps is not None and 0 in taps:
            tapped[0] = x.clone()
        for stop in stops:
            if self._family_stack:
                local = self._rope_local.address(past + x.shape[0])
                self._step_kernels.family_forward(
                    self._stack, start, stop, x.data_ptr(), x.shape[0], past, self._k.data_ptr(), self._v.data_ptr(),
                    self._capacity, self._rope_table, local, self._gemm_threads, self.precision == "int8",
                )
            else:
                self._kernels.layers_forward(
                    self._stack, start, stop, x.data_ptr(), x.shape[0], past, self._k.data_ptr(), self._v.data_ptr(),
                    self._capacity, self._rope_table, self._gemm_threads, self.precision == "int8",
                )
            if stop < self.hparams.n_layers:
                tapped[stop] = x.clone()
            start = stop
        return x

    @property
    def spec_verify_row_ms(self):
        """The verify cost by rows (optional attribute drafters read to size drafts), measured
        by this target on this machine on first use (``row_cost``: cached per file and
        machine); None off the block-kernel path (dense GEMMs, CUDA: not measured)."""
        if not (self.block_weights and self._kernels is not None):
            return None
        if self._row_ms is None:
            from .row_cost import CHECK_ROUNDS, CONTEXT, ROWS, cached

            context = max(self._seq_len, min(CONTEXT, self.max_context_length - max(ROWS)))
            if context + max(ROWS) > self.max_context_length:
                return None  # no room after the cached tokens to measure in
            path_kind = "fused" if self._stack is not None and self.fused_blocks else "per-op"
            halves = "".join(f"|{name}" for name in self._halves)  # 16-bit weights stream other bytes
            self._row_ms = cached(self.path, f"block|{self.dtype}|{self.precision}|{path_kind}{halves}",
                                  lambda: self._measure_row_cost(context, ROWS).profile(),
                                  check=lambda: self._measure_row_cost(context, (max(ROWS),), CHECK_ROUNDS).samples[-1])
        return self._row_ms

    def _measure_row_cost(self, context: int, widths, rounds: int | None = None):
        """The cost by rows (a ``RowTiming``) timed after ``context`` cached tokens (filler tokens
        past the cached ones, dropped again with every timed row: the cache and ``spec_keep``'s
        state are left as they were)."""
        from tsspec_gguf.row_timing import ROUNDS, time_rows

        start, last = self._seq_len, self._last_forward
        vocab = self.hparams.vocab_size
        filler = [(7 + 31 * i) % vocab for i in range(start, context + max(widths))]  # any ids: cost is by rows
        try:
            self.spec_ensure_capacity(context + max(widths))
            if context > start:
                self.spec_forward(filler[: context - start], all_logits_rows=False, want_hidden=False)
            rows = filler[context - start:]
            timing = time_rows(lambda n: self.spec_forward(rows[:n], all_logits_rows=True, want_hidden=False),
                               widths, reset=lambda: self.spec_rewind_cache(context), rounds=rounds or ROUNDS)
        finally:
            self.spec_rewind_cache(start)
            self._last_forward = last
        return timing

    # -- SpeculativeTarget: sizes ------------------------------------------------------------
    @property
    def cache_seq_len(self) -> int:
        return self._seq_len

    @property
    def max_context_length(self) -> int:
        return self._context_limit or self.hparams.context_length

    def spec_set_context_length(self, tokens: int) -> None:
        """Cap the context (``-c/--ctx-size``) at ``tokens``, at most the file's; ValueError
        below the tokens already cached."""
        if not 1 <= tokens or tokens < self._seq_len:
            raise ValueError(f"a context of {tokens} tokens cannot hold the {self._seq_len} cached")
        if tokens > self.hparams.context_length:
            from tsspec.errors import OptionsError

            raise OptionsError(f"--ctx-size {tokens} exceeds the model's context of {self.hparams.context_length}")
        self._context_limit = tokens

    @property
    def spec_feature_size(self) -> int:
        taps = len(self._taps) if self._taps else 1
        return taps * self.hparams.hidden_size

    @property
    def feature_taps(self) -> tuple[int, ...] | None:
        return self._taps

    def spec_set_feature_taps(self, layers: Sequence[int] | None) -> None:
        self._taps = resolve_feature_taps(layers, self.hparams.n_layers)

    # -- KV cache --------------------------------------------------------------------------
    def spec_ensure_capacity(self, required_seq_len: int) -> None:
        if required_seq_len > self.max_context_length:
            raise GenerationError(
                f"{required_seq_len} tokens exceed the model's context of {self.max_context_length}"
            )
        if required_seq_len <= self._capacity:
            return
        hp = self.hparams
        capacity = min(self.max_context_length, max(required_seq_len, 2 * self._capacity, INITIAL_CAPACITY))
        shape = (hp.n_layers, hp.n_kv_heads, capacity, hp.head_dim)
        k = torch.empty(shape, dtype=self._residual_dtype, device=self.device)  # float32 KV
        v = torch.empty(shape, dtype=self._residual_dtype, device=self.device)
        if self._k is not None and self._seq_len:
            k[:, :, : self._seq_len] = self._k[:, :, : self._seq_len]
            v[:, :, : self._seq_len] = self._v[:, :, : self._seq_len]
        self._k, self._v, self._capacity = k, v, capacity
        self._kv_addresses = (k.data_ptr(), v.data_ptr())

    def spec_rewind_cache(self, length: int) -> None:
        if not 0 <= length <= self._seq_len:
            raise ValueError(f"cannot rewind a cache of {self._seq_len} tokens to {length}")
        self._seq_len = length

    def reset(self) -> None:
        self.spec_rewind_cache(0)

    # -- batched paged KV (serving): tsspec_model_llama.paged -------------------------------
    def spec_kv_bytes_per_block(self, block_size: int) -> int:
        from .paged import PagedLlamaKV

        return PagedLlamaKV.bytes_per_block(self, block_size)

    def spec_open_paged(self, num_blocks: int, block_size: int):
        """A ``PagedKV`` over this target's weights (ValueError off the block-kernel path)."""
        from .paged import open_paged

        return open_paged(self, num_blocks, block_size)

    def spec_keep(self, rows_kept: int) -> None:
        """Keep the first ``rows_kept`` rows of the last forward: no recurrent state, so setting
        the KV length is the whole rollback (later forwards overwrite the dropped slots)."""
        start, rows = self._last_forward
        if not 1 <= rows_kept <= rows:
            raise ValueError(f"cannot keep {rows_kept} rows of a forward of {rows}")
        self._seq_len = start + rows_kept

    # -- forward ---------------------------------------------------------------------------
    def _causal_bias(self, past: int, rows: int) -> torch.Tensor | None:
        """Additive mask [group * rows, past + rows]: 0 where a query row may attend, -inf
        elsewhere (row t sees keys 0 .. past + t); None for one row (it sees everything)."""
        if rows == 1:
            return None
        keys = torch.arange(past + rows, device=self.device)
        blocked = keys[None, :] > (past + torch.arange(rows, device=self.device))[:, None]  # [rows, keys]
        bias = torch.zeros(blocked.shape, dtype=self._residual_dtype, device=self.device)
        bias.masked_fill_(blocked, float("-inf"))
        return bias.repeat(self.hparams.group_size, 1)

    @staticmethod
    def _chat_template_origin(tokenizer, hp: LlamaHParams, note: str | None) -> str:
        """Where chat turns are formatted from: the file, the family's built-in, or nowhere."""
        if note is not None:
            return f"built-in {hp.family.builtin_chat_template} (the file has none)"
        return "file" if tokenizer is not None and tokenizer.has_chat_template else "none"

    def weight_formats(self) -> str:
        """How the file's matrix types run, e.g. ``Q5_0 x166 blocks, Q3_K x12 float32``."""
        parts = []
        for kind, (in_blocks, dense) in sorted(self.served_formats.items()):
            if in_blocks:
                parts.append(f"{kind} x{in_blocks} blocks")
            if dense:
                parts.append(f"{kind} x{dense} {'float32' if self.block_weights else str(self.dtype).removeprefix('torch.')}")
        return ", ".join(parts)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, kernel: bool) -> torch.Tensor:
        """RMSNorm of rows x [n, d] by ``weight`` [d]: the compiled kernel (each row the same
        whatever n) or torch."""
        if not kernel:
            return F.rms_norm(x, (x.shape[-1],), weight, self._eps)
        x = x.contiguous()
        out = torch.empty_like(x)
        self._kernels.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], self._eps)
        return out

    def _family_block(self, i: int, x: torch.Tensor, past: int, kernel: bool) -> torch.Tensor:
        """One block of a family whose block is not llama's (per-head Q/K norms, post norms,
        GELU-tanh, sliding windows, soft-capping: ``families.py``), on the compiled per-row
        kernels (``kernel``) or torch ops."""
        hp, layer = self.hparams, self._layers[i]
        rows, end, hd = x.shape[0], past + x.shape[0], hp.head_dim
        sliding = hp.sliding(i)
        h = self._norm(x, layer.attn_norm, kernel)
        qkv = _linear(h.to(self.dtype) if self._cast else h, layer.wqkv, layer.bqkv, self.precision)  # [rows, (nh + 2 nkv) hd]
        if self._cast:
            qkv = qkv.to(self._residual_dtype)
        if layer.q_norm is not None:  # per head, over hd; Q's norm carries the attention scale
            q = self._norm(qkv[:, : hp.q_size].reshape(-1, hd), layer.q_norm, kernel).view(rows, -1)
            k = self._norm(qkv[:, hp.q_size : self._qk_size].reshape(-1, hd), layer.k_norm, kernel).view(rows, -1)
            qkv = torch.cat([q, k, qkv[:, self._qk_size :]], dim=1)
        rope = self._rope_local if sliding else self._rope
        if kernel:
            qkv = qkv.contiguous()
            self._kernels.rope(qkv.data_ptr(), qkv.stride(0), rows, self._qk_heads, hd, hp.rope_dim, rope.address(end), past)
            qk = qkv[:, : self._qk_size].view(rows, self._qk_heads, hd)
        else:
            qk = rope.apply(qkv[:, : self._qk_size].view(rows, self._qk_heads, hd), past)
        k_cache, v_cache = self._k[i], self._v[i]  # [nkv, capacity, hd]
        k_cache[:, past:end] = qk[:, hp.n_heads :].transpose(0, 1)
        v_cache[:, past:end] = qkv[:, self._qk_size :].view(rows, hp.n_kv_heads, hd).transpose(0, 1)
        window = hp.sliding_window if sliding else 0
        if kernel and not hp.attn_softcap:
            attn = self._window_attention(qkv, i, past, window)
        else:
            attn = self._capped_attention(qk, k_cache, v_cache, past, window, rowwise=kernel)
        out = _linear(attn.to(self.dtype) if self._cast else attn, layer.wo, layer.bo, self.precision)
        out = out.to(self._residual_dtype) if self._cast else out
        if layer.post_attn_norm is not None:
            out = self._norm(out, layer.post_attn_norm, kernel)
        x = x + out
        h = self._norm(x, layer.ffn_norm, kernel)
        gate_up = _linear(h.to(self.dtype) if self._cast else h, layer.w_gate_up, None, self.precision)  # [rows, 2 F]
        act = self._gated(gate_up, kernel)  # [rows, F]
        out = _linear(act, layer.w_down, None, self.precision)
        out = out.to(self._residual_dtype) if self._cast else out
        if layer.post_ffn_norm is not None:
            out = self._norm(out, layer.post_ffn_norm, kernel)
        return x + out

    def _gated(self, gate_up: torch.Tensor, kernel: bool) -> torch.Tensor:
        """act(gate) * up of rows [rows, 2 F] -> [rows, F]: on the kernel path the native
        row op the fused family stack runs (the same bits), else torch's."""
        hp = self.hparams
        gelu = hp.family.activation == "gelu_tanh"
        step = self._step_kernels
        if kernel and (not gelu or (step is not None and hasattr(step, "gelu_mul"))):
            gate_up = gate_up.contiguous()
            act = torch.empty((gate_up.shape[0], hp.ffn_size), dtype=torch.float32)
            (step.gelu_mul if gelu else self._kernels.silu_mul)(gate_up.data_ptr(), act.data_ptr(), gate_up.shape[0],
                                                               hp.ffn_size)
            return act
        gate, up = gate_up[:, : hp.ffn_size], gate_up[:, hp.ffn_size :]
        return (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up

    def _window_attention(self, qkv: torch.Tensor, i: int, past: int, window: int) -> torch.Tensor:
        """Causal attention on the kernel, a sliding layer's row at position p seeing keys
        p - window + 1 .. p: rows whose window starts at key 0 share one call, every later row
        has its own call on the cache from its window's first key (so a verify row is computed
        exactly like the same row decoded alone). The whole cache stays: a rollback never
        loses a key a later row needs. [rows, nh * hd]"""
        hp, rows = self.hparams, qkv.shape[0]
        k_cache, v_cache = self._k[i], self._v[i]
        if not window or past + rows <= window:
            return causal_attention(qkv, k_cache, v_cache, past, hp.n_heads)
        out = torch.empty((rows, hp.q_size), dtype=torch.float32)
        first = max(0, min(rows, window - past))  # rows at positions < window
        if first:
            out[:first] = causal_attention(qkv[:first], k_cache, v_cache, past, hp.n_heads)
        key_bytes = hp.head_dim * k_cache.element_size()
        threads = torch.get_num_threads()
        for t in range(first, rows):
            start = past + t - window + 1
            self._kernels.attention(
                qkv[t].data_ptr(), qkv.stride(0), k_cache.data_ptr() + start * key_bytes,
                v_cache.data_ptr() + start * key_bytes, self._capacity, out[t].data_ptr(), 1,
                hp.n_heads, hp.n_kv_heads, hp.head_dim, window - 1, threads,
            )
        return out

    def _capped_attention(self, qk, k_cache, v_cache, past: int, window: int, rowwise: bool) -> torch.Tensor:
        """Torch attention with soft-capped scores (``attn_softcap``) and an optional sliding
        window: ``rowwise`` computes each row on its own (the same ops whatever the row count,
        for the kernel path), else one masked batch. [rows, nh * hd]"""
        hp, rows = self.hparams, qk.shape[0]
        cap, end = hp.attn_softcap, past + rows
        if rowwise:
            out = torch.empty((rows, hp.q_size), dtype=qk.dtype)
            for t in range(rows):
                p = past + t
                start = max(0, p - window + 1) if window else 0
                q = qk[t, : hp.n_heads].reshape(hp.n_kv_heads, hp.group_size, hp.head_dim)
                scores = torch.bmm(q, k_cache[:, start : p + 1].transpose(1, 2))  # [nkv, group, keys]
                if cap:
                    scores = torch.tanh(scores / cap) * cap
                out[t] = torch.bmm(torch.softmax(scores, dim=-1), v_cache[:, start : p + 1]).reshape(-1)
            return out
        q = qk[:, : hp.n_heads].reshape(rows, hp.n_kv_heads, hp.group_size, hp.head_dim)
        q = q.permute(1, 2, 0, 3).reshape(hp.n_kv_heads, hp.group_size * rows, hp.head_dim)
        scores = torch.bmm(q, k_cache[:, :end].transpose(1, 2))  # [nkv, group * rows, end]
        if cap:
            scores = torch.tanh(scores / cap) * cap
        positions = past + torch.arange(rows, device=qk.device)[:, None]
        keys = torch.arange(end, device=qk.device)[None, :]
        blocked = keys > positions
        if window:
            blocked |= keys <= positions - window
        scores = scores.masked_fill(blocked.repeat(hp.group_size, 1), float("-inf"))
        attn = torch.bmm(torch.softmax(scores, dim=-1), v_cache[:, :end])  # [nkv, group * rows, hd]
        return attn.view(hp.n_kv_heads, hp.group_size, rows, hp.head_dim).permute(2, 0, 1, 3).reshape(rows, hp.q_size)

    def _logits(self, normed: torch.Tensor) -> torch.Tensor:
        """The LM head on normed rows, soft-capped where the family caps logits."""
        logits = _linear(normed.to(self.dtype), self._lm_head, None, self.precision)
        cap = self.hparams.final_softcap
        if cap:
            logits = torch.tanh(logits.to(self._residual_dtype) / cap) * cap
        return logits

    def _threads(self, n: int) -> None:
        if n != self._active_threads:
            torch.set_num_threads(n)
            self._active_threads = n

    def _kernel_block(self, i: int, x: torch.Tensor, past: int) -> torch.Tensor:
        """``_block`` on the compiled kernels (CPU float32): RMSNorm, RoPE, attention and the
        SiLU product per row in C, the matmuls on blocks (or torch for dense weights). Each row
        is computed the same way whatever the row count. The tensors are built here, so the
        kernels are called directly (the checked wrappers are tsspec_gguf.rowops)."""
        if not self._llama_block:
            return self._family_block(i, x, past, kernel=True)
        hp, layer, k = self.hparams, self._layers[i], self._kernels
        rows, H, hd = x.shape[0], hp.hidden_size, hp.head_dim
        end = past + rows
        h = torch.empty_like(x)
        k.rms_norm(x.data_ptr(), layer.attn_norm.data_ptr(), h.data_ptr(), rows, H, self._eps)
        qkv = _linear(h, layer.wqkv, layer.bqkv, self.precision)  # [rows, (nh + 2 nkv) hd]; Q pre-scaled
        k.rope(qkv.data_ptr(), qkv.stride(0), rows, self._qk_heads, hd, hp.rope_dim, self._rope_table, past)
        k_cache, v_cache = self._k[i], self._v[i]  # [nkv, capacity, hd]
        k_cache[:, past:end] = qkv[:, hp.q_size : self._qk_size].view(rows, hp.n_kv_heads, hd).transpose(0, 1)
        v_cache[:, past:end] = qkv[:, self._qk_size :].view(rows, hp.n_kv_heads, hd).transpose(0, 1)
        attn = causal_attention(qkv, k_cache, v_cache, past, hp.n_heads)  # [rows, nh * hd]
        x = self._residual_add(x, attn, layer.wo, layer.bo)
        h = torch.empty_like(x)
        k.rms_norm(x.data_ptr(), layer.ffn_norm.data_ptr(), h.data_ptr(), rows, H, self._eps)
        gate_up = _linear(h, layer.w_gate_up, None, self.precision)  # [rows, 2 F]
        act = torch.empty((rows, hp.ffn_size), dtype=torch.float32)
        k.silu_mul(gate_up.data_ptr(), act.data_ptr(), rows, hp.ffn_size)
        return self._residual_add(x, act, layer.w_down, None)

    def _block(self, i: int, x: torch.Tensor, past: int, bias: torch.Tensor | None) -> torch.Tensor:
        """One transformer block on the residual rows x [rows, H] (appends their K/V)."""
        if not self._llama_block:
            return self._family_block(i, x, past, kernel=False)
        hp, layer = self.hparams, self._layers[i]
        rows, end = x.shape[0], past + x.shape[0]
        wide, narrow = self._gemm_threads, self._small_threads
        h = F.rms_norm(x, self._norm_shape, layer.attn_norm, self._eps)
        if self._cast:
            h = h.to(self.dtype)
        self._threads(wide)
        qkv = _linear(h, layer.wqkv, layer.bqkv)  # [rows, (nh + 2 nkv) hd]; Q pre-scaled
        self._threads(narrow)
        if self._cast:  # attention runs in float32 whatever the matmul dtype
            qkv = qkv.to(self._residual_dtype)
        qk = self._rope.apply(qkv[:, : self._qk_size].view(rows, self._qk_heads, hp.head_dim), past)
        k_cache, v_cache = self._k[i], self._v[i]  # [nkv, capacity, hd]
        k_cache[:, past:end] = qk[:, hp.n_heads :].transpose(0, 1)
        v_cache[:, past:end] = qkv[:, self._qk_size :].view(rows, hp.n_kv_heads, hp.head_dim).transpose(0, 1)
        attn = self._torch_attention(qk, k_cache, v_cache, past, end, bias)
        if self._cast:
            attn = attn.to(self.dtype)
        self._threads(wide)
        x = self._residual_add(x, attn, layer.wo, layer.bo)
        self._threads(narrow)
        h = F.rms_norm(x, self._norm_shape, layer.ffn_norm, self._eps)
        if self._cast:
            h = h.to(self.dtype)
        self._threads(wide)
        gate_up = _linear(h, layer.w_gate_up)  # [rows, 2 F]
        self._threads(narrow)
        act = F.silu(gate_up[:, : hp.ffn_size]) * gate_up[:, hp.ffn_size :]
        self._threads(wide)
        return self._residual_add(x, act, layer.w_down, None)

    def _torch_attention(self, qk, k_cache, v_cache, past: int, end: int, bias) -> torch.Tensor:
        """Attention with torch ops: [rows, nh * hd]."""
        hp, rows = self.hparams, qk.shape[0]
        if rows == 1:  # head j uses KV head j // group: heads of a group are query rows of it
            q = qk[:, : hp.n_heads].view(hp.n_kv_heads, hp.group_size, hp.head_dim)
        else:  # [nkv, group * rows, hd], rows ordered (group, row) to match the mask
            q = qk[:, : hp.n_heads].reshape(rows, hp.n_kv_heads, hp.group_size, hp.head_dim)
            q = q.permute(1, 2, 0, 3).reshape(hp.n_kv_heads, hp.group_size * rows, hp.head_dim)
        scores = torch.bmm(q, k_cache[:, :end].transpose(1, 2))  # [nkv, group * rows, end]
        if bias is not None:
            scores += bias
        attn = torch.bmm(torch.softmax(scores, dim=-1), v_cache[:, :end])  # [nkv, group * rows, hd]
        if rows == 1:
            attn = attn.view(1, hp.q_size)
        else:
            attn = attn.view(hp.n_kv_heads, hp.group_size, rows, hp.head_dim).permute(2, 0, 1, 3)
            attn = attn.reshape(rows, hp.q_size)
        return attn

    def _residual_add(self, x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
        """x + h @ weight^T (+ bias), in one GEMM when the dtypes allow."""
        if isinstance(weight, BlockMatrix):
            return weight.linear(h, x if bias is None else x + bias, precision=self.precision)
        if self._cast:
            return x + F.linear(h, weight, bias).to(self._residual_dtype)
        if bias is not None:
            x = x + bias
        return torch.addmm(x, h, weight.t())

    @torch.inference_mode()
    def forward_residual(self, tokens: Sequence[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run the blocks over ``tokens`` at positions cache_seq_len.. and append them to the KV
        cache. Returns (final residual [rows, H] before the final norm, tapped residuals)."""
        rows = len(tokens)
        if rows == 0:
            raise ValueError("spec_forward needs at least one token")
        ids = [int(t) for t in tokens]
        vocab = self.hparams.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"token ids must lie in [0, {vocab})")
        past = self._seq_len
        self.spec_ensure_capacity(past + rows)
        self._gemm_threads = self._active_threads = torch.get_num_threads()
        narrow = self.small_ops_single_thread and rows <= SMALL_OP_ROWS
        self._small_threads = 1 if narrow else self._gemm_threads
        taps = self._taps
        tapped: dict[int, torch.Tensor] = {}
        try:
            self._threads(self._small_threads)
            x = _embedding(torch.tensor(ids, device=self.device), self._embed)  # [rows, H]
            if self._cast:
                x = x.to(self._residual_dtype)
            if self._embed_scale is not None:
                x = x * self._embed_scale
            kernel_path = self._kernels is not None
            if kernel_path:  # one thread count for the whole pass: no torch op here is wide
                self._threads(self._gemm_threads)
                self._rope.ensure(past + rows)
                self._rope_table = torch.view_as_real(self._rope._rot).data_ptr()  # [pos, half, 2]
            bias = None if kernel_path else self._causal_bias(past, rows)
            if kernel_path and self.fused_blocks and self._stack is not None and rows <= GEMM_ROWS:
                x = self._fused_blocks(x.contiguous(), past, taps, tapped)
            else:
                for i in range(self.hparams.n_layers):
                    if taps is not None and i in taps:
                        tapped[i] = x
                    x = self._kernel_block(i, x, past) if kernel_path else self._block(i, x, past, bias)
        finally:
            self._threads(self._gemm_threads)
        tapped[self.hparams.n_layers] = x
        self._seq_len = past + rows
        return x, [tapped[t] for t in taps or ()]

    def spec_forward(
        self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [rows or 1, vocab] float32; hidden [rows, spec_feature_size] float32 or None."""
        self._last_forward = (self._seq_len, len(tokens))
        # one native call when it can (it runs no torch op that autograd could record, so it
        # needs no inference mode around it); the Python path otherwise
        step = self._step_in_one_call(tokens, all_logits_rows, want_hidden)
        if step is not None:
            return step
        return self._spec_forward_python(tokens, all_logits_rows, want_hidden)

    @torch.inference_mode()
    def _spec_forward_python(self, tokens: Sequence[int], all_logits_rows: bool, want_hidden: bool):
        # (no padding of short verifies to a "faster" GEMM shape: what a row count costs is the
        # cost governor's to measure on the machine at hand, not a constant from another one)
        x, tapped = self.forward_residual(tokens)
        normed = F.rms_norm(x if all_logits_rows else x[-1:], self._norm_shape, self._output_norm, self._eps)
        logits = self._logits(normed).to(OUTPUT_DEVICE, torch.float32)
        hidden = None
        if want_hidden:
            if self._taps is not None:
                hidden = torch.cat(tapped, dim=-1)
            else:
                hidden = normed if all_logits_rows else F.rms_norm(x, self._norm_shape, self._output_norm, self._eps)
            hidden = hidden.to(OUTPUT_DEVICE, torch.float32)
        return logits, hidden

    # -- drafter-facing surface ------------------------------------------------------------
    @torch.inference_mode()
    def embed(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Raw token embeddings [n, H] (float32, CPU; without a family's sqrt(H) scale)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device).reshape(-1)
        return _embedding(ids, self._embed).to(OUTPUT_DEVICE, torch.float32)

    @torch.inference_mode()
    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final RMSNorm of [n, H] rows (float32, CPU)."""
        normed = F.rms_norm(hidden.to(self.device, self._residual_dtype), self._norm_shape, self._output_norm, self._eps)
        return normed.to(OUTPUT_DEVICE, torch.float32)

    @torch.inference_mode()
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] of already-normed rows [n, H] (no final norm applied here; the
        family's logit soft-capping is)."""
        return self._logits(hidden.to(self.device, self._residual_dtype)).to(OUTPUT_DEVICE, torch.float32)

    def __repr__(self) -> str:
        hp = self.hparams
        return (
            f"LlamaTarget({hp.architecture}, layers={hp.n_layers}, hidden={hp.hidden_size}, "
            f"heads={hp.n_heads}/{hp.n_kv_heads}, vocab={hp.vocab_size}, {self.device}, {self.dtype})"
        )
