"""Separate NextN drafter files (GGUF architecture ``nextn``): layout, writing, attaching.

A trained per-token head for a target that carries none (``tsspec train-drafter --kind mtp``).
Tensor names follow the NextN block of llama.cpp's MTP models, at block 0 of the file::

    blk.0.nextn.eh_proj.weight            [H, 2H]
    blk.0.nextn.enorm.weight / hnorm      [H]
    blk.0.nextn.shared_head_norm.weight   [H]
    blk.0.nextn.shared_head_head.weight   [K, H]   the draft-vocabulary LM head
    blk.0.attn_norm / attn_q / attn_k / attn_v / attn_output / ffn_norm / ffn_gate / ffn_up /
    ffn_down (.weight)                              one llama decoder layer
    blk.0.attn_q_norm / attn_k_norm (.weight) [hd]  optional: per-head q/k norms (a Qwen3 layer)
    blk.0.nextn.fc.weight                 [H, taps*H]  EAGLE-3-style heads only: the fusion of
                                                       the tapped target layers

Metadata (prefix ``nextn.``): ``embedding_length``, ``feed_forward_length``,
``attention.head_count``, ``attention.head_count_kv``, ``attention.key_length``,
``attention.layer_norm_rms_epsilon``, ``rope.freq_base``, ``draft_vocab`` (int array: the
target ids of the K head rows), ``target.architecture`` / ``target.shape_digest`` /
``target.sha256`` / ``target.vocab_size`` (the target it was trained on),
``tsspec.training.manifest`` (JSON: corpus sources, token counts, licenses, recipe),
``shared_head`` (true: no ``shared_head_head`` and no ``draft_vocab``; the head drafts with the
target's own LM head over its whole vocabulary), and
optionally the settings its figures recommend: ``recommended.pmin`` (the confidence gate) and
``recommended.draft_max`` (the longest chain worth drafting). An EAGLE-3-style head also
carries ``feature_layers`` (int array: the target layers whose entering residuals it reads,
low, middle, high); attaching it sets the target's feature taps to them. The draft-head algorithm uses
them where the operator set neither ``--spec-pmin`` nor ``--spec-draft``.

The embedding is the target's (``target.embed``), so the file stays small.
"""

from __future__ import annotations

import copy
import json
import threading
from typing import Any, Sequence

import attrs
import numpy as np
import torch

from tsspec.errors import ModelLoadError
from tsspec.protocols import DraftHeadKind, HeadCounts
from tsspec.switches import switch_on

from .confidence import GATE_TOP_K, top1_over_topk
from .nextn_model import NextNConfig, NextNModule, rope_tables

__all__ = ["ARCHITECTURE", "NATIVE_ENV", "write_nextn", "read_nextn", "NextNFileHead", "attach_nextn"]

ARCHITECTURE = "nextn"
NATIVE_ENV = "TS_MTP_NATIVE"  # 0: the torch module drafts even where the compiled kernels could
TENSORS = {  # module parameter -> GGUF tensor name
    "eh_proj": "blk.0.nextn.eh_proj.weight",
    "enorm": "blk.0.nextn.enorm.weight",
    "hnorm": "blk.0.nextn.hnorm.weight",
    "head_norm": "blk.0.nextn.shared_head_norm.weight",
    "head": "blk.0.nextn.shared_head_head.weight",
    "attn_norm": "blk.0.attn_norm.weight",
    "wq": "blk.0.attn_q.weight",
    "wk": "blk.0.attn_k.weight",
    "wv": "blk.0.attn_v.weight",
    "wo": "blk.0.attn_output.weight",
    "ffn_norm": "blk.0.ffn_norm.weight",
    "w_gate": "blk.0.ffn_gate.weight",
    "w_up": "blk.0.ffn_up.weight",
    "w_down": "blk.0.ffn_down.weight",
}
QK_NORMS = {"q_norm": "blk.0.attn_q_norm.weight", "k_norm": "blk.0.attn_k_norm.weight"}  # when cfg.qk_norm
FC_TENSOR = "blk.0.nextn.fc.weight"  # EAGLE-3-style heads (cfg.feature_layers): [H, taps * H]
MATRICES = {"fc", "eh_proj", "head", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}


def tensor_names(cfg: NextNConfig) -> dict[str, str]:
    """Module parameter -> GGUF tensor name, for the tensors a head of ``cfg`` carries."""
    names = {p: n for p, n in TENSORS.items() if not (p == "head" and cfg.shared_head)}
    return {**names, **(QK_NORMS if cfg.qk_norm else {}), **({"fc": FC_TENSOR} if cfg.feature_layers else {})}
OUTTYPES = ("f32", "f16", "q8_0")


def write_nextn(path, module: NextNModule, *, target: dict[str, Any], manifest: dict | None = None,
                outtype: str = "f16", recommended: dict[str, float] | None = None, shared_head: bool = False) -> str:
    """Write ``module`` as a ``nextn`` GGUF. ``target``: architecture, shape_digest, sha256,
    vocab_size of the model it was trained on. ``shared_head``: the module's rows are the
    target's whole LM head; the file leaves them out and borrows the target's at attach."""
    from gguf import GGMLQuantizationType, GGUFValueType

    from tsspec_gguf.gguf_writer_util import write_gguf

    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    cfg = module.cfg
    if shared_head and not cfg.shared_head:
        ids = torch.sort(module.draft_ids).values
        if module.head.shape[0] != int(target["vocab_size"]) or not bool((ids == torch.arange(ids.numel())).all()):
            raise ValueError("a shared head covers the target's whole vocabulary")
        cfg = attrs.evolve(cfg, draft_vocab=0, shared_head=True)
    a = ARCHITECTURE
    meta: dict[str, Any] = {
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": cfg.num_heads,
        f"{a}.attention.head_count_kv": cfg.num_kv_heads,
        f"{a}.attention.key_length": cfg.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_eps),
        f"{a}.rope.freq_base": float(cfg.rope_theta),
        f"{a}.target.architecture": str(target["architecture"]),
        f"{a}.target.shape_digest": str(target.get("shape_digest", "")),
        f"{a}.target.sha256": str(target.get("sha256", "") or ""),
        f"{a}.target.vocab_size": int(target["vocab_size"]),
        **({f"{a}.feature_layers": ([int(i) for i in cfg.feature_layers], (GGUFValueType.ARRAY, GGUFValueType.INT32))}
           if cfg.feature_layers else {}),
        "general.name": f"NextN drafter for {target.get('name', target['architecture'])}",
        "tsspec.training.manifest": json.dumps(manifest or {}, sort_keys=True),
    }
    rec = recommended or {}
    if cfg.shared_head:
        meta[f"{a}.shared_head"] = True
    else:
        meta[f"{a}.draft_vocab"] = ([int(i) for i in module.draft_ids.tolist()], (GGUFValueType.ARRAY, GGUFValueType.INT32))
    if rec.get("pmin") is not None:
        meta[f"{a}.recommended.pmin"] = float(rec["pmin"])
    if rec.get("draft_max") is not None:
        meta[f"{a}.recommended.draft_max"] = int(rec["draft_max"])
    tensors = {}
    for param, name in tensor_names(cfg).items():
        value = getattr(module, param).detach().float().cpu().numpy()
        if param in MATRICES and outtype == "q8_0" and value.shape[-1] % 32 == 0:
            tensors[name] = (value, GGMLQuantizationType.Q8_0)
        elif param in MATRICES and outtype in ("f16", "q8_0"):
            tensors[name] = value.astype(np.float16)
        else:
            tensors[name] = value.astype(np.float32)  # norms stay float32
    return write_gguf(path, a, meta, tensors)


def read_nextn(path) -> tuple[NextNModule, dict[str, Any], dict]:
    """(module, target facts, manifest) from a ``nextn`` GGUF; ModelLoadError on any problem."""
    from tsspec_gguf.gguf_file import GGUFFile

    with GGUFFile(path) as f:
        if f.architecture != ARCHITECTURE:
            raise ModelLoadError(path, f"is a {f.architecture!r} file, not a NextN drafter ({ARCHITECTURE!r})")
        a = ARCHITECTURE
        draft = f.get(f"{a}.draft_vocab", None)
        draft_ids = [int(x) for x in draft] if draft is not None else []
        shared = bool(f.get(f"{a}.shared_head", False))
        cfg = NextNConfig(
            hidden_size=f.require(f"{a}.embedding_length", int),
            intermediate_size=f.require(f"{a}.feed_forward_length", int),
            num_heads=f.require(f"{a}.attention.head_count", int),
            num_kv_heads=f.require(f"{a}.attention.head_count_kv", int),
            head_dim=f.require(f"{a}.attention.key_length", int),
            rms_eps=float(f.require(f"{a}.attention.layer_norm_rms_epsilon")),
            rope_theta=float(f.require(f"{a}.rope.freq_base")),
            draft_vocab=0 if shared else len(draft_ids),
            qk_norm=f.has_tensor(QK_NORMS["q_norm"]),
            shared_head=shared,
            feature_layers=tuple(int(x) for x in (f.get(f"{a}.feature_layers", None) or ())),
        )
        target = {
            "architecture": f.require(f"{a}.target.architecture", str),
            "shape_digest": f.get(f"{a}.target.shape_digest", ""),
            "sha256": f.get(f"{a}.target.sha256", ""),
            "vocab_size": f.require(f"{a}.target.vocab_size", int),
        }
        pmin = f.get(f"{a}.recommended.pmin", None)
        draft_max = f.get(f"{a}.recommended.draft_max", None)
        if pmin is not None and not 0.0 <= float(pmin) <= 1.0:
            raise ModelLoadError(path, f"{a}.recommended.pmin must lie in [0, 1], got {pmin}")
        if draft_max is not None and int(draft_max) < 1:
            raise ModelLoadError(path, f"{a}.recommended.draft_max must be at least 1, got {draft_max}")
        target["recommended"] = {"pmin": None if pmin is None else round(float(pmin), 6),  # stored as float32
                                 "draft_max": None if draft_max is None else int(draft_max)}
        if shared and draft_ids:
            raise ModelLoadError(path, f"{a}.shared_head drafts over the whole vocabulary: it takes no {a}.draft_vocab")
        if not draft_ids and not shared:
            raise ModelLoadError(path, f"{a}.draft_vocab is missing or empty")
        module = NextNModule(cfg, target["vocab_size"])
        with torch.no_grad():
            for param, name in tensor_names(cfg).items():
                want = tuple(getattr(module, param).shape)
                getattr(module, param).copy_(f.require_tensor(name, want))
            if not shared:
                module.draft_ids.copy_(torch.tensor(draft_ids, dtype=torch.long))
        try:
            manifest = json.loads(f.get("tsspec.training.manifest", "{}") or "{}")
        except json.JSONDecodeError:
            manifest = {}
    if int(module.draft_ids.max()) >= target["vocab_size"] or int(module.draft_ids.min()) < 0:
        raise ModelLoadError(path, "draft vocabulary ids fall outside the target vocabulary")
    module.requires_grad_(False)
    return module, target, manifest


class _SharedWeights:
    """What a head and its sequence views share besides the module: the native engine whose
    weights every view's engine borrows (built once, on first use) and the torch engine's int8
    packing (done once)."""

    def __init__(self):
        self.lock = threading.Lock()
        self._native = None

    def native_engine(self, module: NextNModule, embed):
        from . import native_head

        with self.lock:
            if self._native is None:
                self._native = native_head.NativeNextN(module, embed)
            return self._native

    def pack_torch(self, module: NextNModule) -> None:
        with self.lock:
            if module.__dict__.get("_packed") is None:
                module.pack_int8()


class _single_thread:
    """One intra-op thread inside a head call: a head step is many small ops, and on a shared
    CPU two OpenMP threads waiting on each other at every barrier (even a fill of the
    vocabulary-sized logits) cost more than the work. The trunk does the same for small ops."""

    def __enter__(self):
        self.threads = torch.get_num_threads()
        if self.threads > 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc):
        if self.threads > 1:
            torch.set_num_threads(self.threads)


class NextNFileHead:
    """A per-token DraftHead over a ``NextNModule`` bound to a target (its embedding).

    KV cache: positions ``base .. end-1``; position 0 has no predecessor row and is never fed
    (as in the in-checkpoint MTP heads). A catch-up from ``start`` drops everything at or after
    ``start``; a start past ``end`` is a gap the head never saw and it restarts there.

    Two engines run the same layer: the compiled kernels (``native_head.NativeNextN``, a few
    native calls a head call) on the CPU when they are built, and the torch module otherwise or
    with ``TS_MTP_NATIVE=0`` (also the reference the tests hold the native one to). Each keeps
    its own KV cache; ``use_native`` switches engines and starts a new sequence.

    Sequence views: ``for_sequence()`` returns a head over the same weights (the module, the
    native engine's int8 matrices and layer stack, the embedding rows) with its own KV cache,
    RoPE table and positions; the ``draft-head`` algorithm drives one view per speculator, so
    sequences served at once never see each other's context. ``close()`` on a view frees its
    cache (it regrows if the view is used again). ``counts`` (``HeadCounts``): a view's calls and
    rows, also added to the head's (the totals over every sequence).

    The head itself (``target.draft_head``) still serves direct callers as one sequence: a lock
    per head or view runs one call at a time on it, so no call grows or replaces the cache or
    RoPE table while the kernels hold their addresses (a native call releases the GIL).

    Compact logits: ``draft_vocab_ids`` [K] are the target ids the head can propose, ascending;
    ``draft_step(..., compact=True)`` and ``draft_catch_up_and_step(..., compact=True)`` return
    logits over those ids only (no vocabulary-sized vector). Without ``compact`` the logits are
    the protocol's [vocab], -inf outside the draft vocabulary.
    """

    kind = DraftHeadKind.PER_TOKEN
    block_size = 1
    # a catch-up past the cache's end restarts it there, and draft-head shows a head at most the
    # newest 8 committed rows: after a reused KV prefix (the server's prefix cache, a chat's
    # shared system prompt) the first proposal sees the same rows as without the reuse once the
    # prompt's new part is longer than that, and fewer rows (less context) otherwise
    resumes_after_gap = True
    # a small drafter trained apart from its target: under `auto` it backs up the weight-free
    # algorithm (proposes where prompt lookup finds nothing) instead of replacing it
    auto_fallback = True

    def __init__(self, module: NextNModule, target, *, source: str = "", max_context: int = 1 << 16,
                 recommended: dict | None = None):
        self.m = module.eval()
        # the settings the file's figures recommend (None: the algorithm's own defaults)
        rec = recommended or {}
        self.recommended_pmin: float | None = rec.get("pmin")
        self.recommended_draft_max: int | None = rec.get("draft_max")
        self.target = target
        self.source = source
        cfg = module.cfg
        self.hidden_size = cfg.hidden_size
        self.vocab_size = module.vocab_size
        self.max_context = max_context
        module.sort_draft_vocab()  # ascending ids: compact argmax ties go to the lowest id
        self.draft_vocab_ids = module.draft_ids  # [K] ascending target ids
        self._shared = _SharedWeights()  # what the head and its sequence views share
        self.counts = HeadCounts()
        self._native = None
        self._new_state()
        self.use_native(switch_on(NATIVE_ENV))

    def _new_state(self) -> None:
        """Fresh sequence state: an empty KV cache and RoPE table."""
        self._drop_cache()
        self._busy = threading.RLock()  # one call at a time on this head or view (class docstring)

    @property
    def native(self) -> bool:
        """True while the compiled kernels run the head."""
        return self._native is not None

    def for_sequence(self) -> "NextNFileHead":
        """A view for one sequence: the same weights and engine (nothing copied), its own KV
        cache, RoPE table and positions (see the class docstring)."""
        with self._busy:
            view = copy.copy(self)  # shallow: module, target, shared weights
            view._new_state()
            view._native = None if self._native is None else self._native.for_sequence()
            view.counts = self.counts.view()
        return view

    def close(self) -> None:
        """Free this head's (or view's) sequence state; a later call starts a new sequence."""
        with self._busy:
            self._drop_cache()
            if self._native is not None:
                self._native.release()

    def _drop_cache(self) -> None:
        cfg = self.m.cfg
        self._k = torch.zeros(0, cfg.num_kv_heads, cfg.head_dim)  # [cap, nkv, hd]
        self._v = torch.zeros(0, cfg.num_kv_heads, cfg.head_dim)
        self.base: int | None = None
        self.end = 0
        self._rope_size = 0
        self._cos = self._sin = None

    def use_native(self, on: bool) -> bool:
        """Run on the compiled kernels (when ``on`` and they can) or on the torch module; starts
        a new sequence (the engines keep separate caches). Returns whether native is now on.
        Views made afterwards follow the head's engine."""
        from . import native_head

        with self._busy:
            self.reset()
            if not on or not native_head.available(self.m):
                self._native = None
                self._shared.pack_torch(self.m)  # the torch engine drafts on int8 blocks where it can
            elif self._native is None:
                self._native = self._shared.native_engine(self.m, self.target.embed).for_sequence()
            return self._native is not None

    def reset(self) -> None:
        with self._busy:
            self.base, self.end = None, 0

    def draft_step(self, token: int, h_prev: torch.Tensor, pos: int, *, compact: bool = False):
        return self.draft_catch_up_and_step([int(token)], h_prev.reshape(1, -1), pos, compact=compact)

    def draft_catch_up(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int) -> None:
        with self._busy:
            if self._native is not None:
                self._advance_native([int(t) for t in tokens], h_rows, int(start_pos), want_last=False)
            else:
                self._advance([int(t) for t in tokens], h_rows, int(start_pos), want_last=False)

    def draft_catch_up_and_step(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int, *,
                                compact: bool = False):
        """(logits for the position after the last token, the head's output row [H]); logits
        [K] over ``draft_vocab_ids`` with ``compact``, else [vocab] with -inf elsewhere."""
        with self._busy:
            if self._native is not None:  # one native call (the kernels take torch's thread count, as the target's do)
                last, small = self._advance_native([int(t) for t in tokens], h_rows, int(start_pos), want_last=True)
            else:
                with _single_thread(), torch.inference_mode():
                    last = self._advance([int(t) for t in tokens], h_rows, int(start_pos), want_last=True)  # [H]
                    small = self.m.logits(last)  # [K]
        if compact:
            return small, last
        with torch.inference_mode():
            logits = torch.full((self.vocab_size,), float("-inf"))
            logits.index_copy_(0, self.m.draft_ids, small)
        return logits, last

    def draft_gated(self, tokens: list[int], h_rows: torch.Tensor | None, start_pos: int, cut: int,
                    top_k: int = GATE_TOP_K, *, last: torch.Tensor | None = None) -> tuple[int, float, torch.Tensor]:
        """``draft_catch_up_and_step(tokens, rows, start_pos, compact=True)`` and the gate
        (``confidence.top1_over_topk``) on its logits[:cut], in one: (the top-1's index into
        ``draft_vocab_ids``, its probability over the top ``top_k``, the output row [H] to
        chain), the same values bit for bit. ``tokens``: ints; ``1 <= cut <= K``. The rows:
        ``h_rows`` [n, H]; or, with ``last`` (the last token's row [H]), the first n - 1 rows of
        ``h_rows`` (which may be longer, e.g. a buffer; None when n is 1) then ``last``, read
        in place. On the compiled kernels (float32 contiguous rows) it is ONE native call that
        makes no tensor, and the output row is a buffer of the head's, valid until its call
        after next: chain it into the next call, or copy it to keep it."""
        n, f32 = len(tokens), torch.float32
        if self.m.fc is not None:  # tapped trunk rows go in fused ([n, H]); own output rows as they are
            if last is not None and last.numel() != self.hidden_size:
                last = self._fused(last.reshape(1, -1)).reshape(-1)
            if h_rows is not None and h_rows.shape[-1] != self.hidden_size:
                h_rows = self._fused(h_rows[: n - 1] if last is not None else h_rows)
        with self._busy:
            native, width = self._native, self.hidden_size
            # the native gate keeps at most 64 candidates and the per-op attribution mode
            # (TS_MTP_ONE_CALL=0) times the head's kernels one by one: both take the two calls
            if native is not None and start_pos > 0 and n and 1 <= top_k <= 64 and native.one_call:
                if last is None:
                    fits = h_rows.shape == (n, width) and h_rows.dtype == f32 and h_rows.is_contiguous()
                else:
                    fits = last.dtype == f32 and last.is_contiguous() and last.numel() == width and (
                        n == 1 or (h_rows is not None and h_rows.dim() == 2 and h_rows.shape[0] >= n - 1
                                   and h_rows.shape[1] == width and h_rows.dtype == f32 and h_rows.is_contiguous()))
                if fits:  # _advance_native's checks and placing, inline (this runs once a draft token)
                    if self.base is None or start_pos < self.base or start_pos > self.end:
                        self.base = start_pos
                    self.end = start_pos
                    at = start_pos - self.base
                    if at + n > native.capacity:
                        native.ensure(at + n, self.max_context)
                    self.counts.add(n)
                    gated = native.step_gated(tokens, h_rows, at, self.base, cut, top_k, last)
                    self.end = start_pos + n
                    return gated
        if last is not None:
            h_rows = last.reshape(1, -1) if n == 1 else torch.cat([h_rows[: n - 1], last.reshape(1, -1).to(h_rows.dtype)])
        logits, out = self.draft_catch_up_and_step(tokens, h_rows, start_pos, compact=True)
        index, probability = top1_over_topk(logits[:cut], top_k)
        return index, probability, out

    def draft_block(self, last_token, h_prev, position, max_tokens):
        raise NotImplementedError("a NextN head is a per-token head: use draft_step")

    def _place(self, start: int) -> None:
        if self.base is None or start < self.base or start > self.end:
            self.base, self.end = start, start
        else:
            self.end = start

    def _ensure(self, rows: int) -> None:
        if rows <= self._k.shape[0]:
            return
        cap = min(max(rows, 2 * self._k.shape[0], 256), max(rows, self.max_context))
        k = torch.zeros(cap, *self._k.shape[1:])
        v = torch.zeros(cap, *self._v.shape[1:])
        k[: self._k.shape[0]] = self._k
        v[: self._v.shape[0]] = self._v
        self._k, self._v = k, v

    @torch.inference_mode()
    def _fused(self, rows: torch.Tensor) -> torch.Tensor:
        """Tapped trunk rows [n, taps * H] as the [n, H] float32 rows the layer reads."""
        if rows.dim() != 2 or rows.shape[1] != self.m.fc.shape[1]:
            raise ValueError(f"this EAGLE-3-style head reads trunk rows of width {self.m.fc.shape[1]} "
                             f"(taps {list(self.m.cfg.feature_layers)}), got {tuple(rows.shape)}; are feature taps set?")
        return self.m.fuse(rows.float()).contiguous()

    def _inputs(self, tokens: list[int], h_rows: torch.Tensor, start: int, want_last: bool):
        """The rows to feed, checked: (tokens, h_rows [n, H], start), or None when nothing is
        left to feed (a lone position-0 row, which has no predecessor; the head starts at 1).
        Tapped trunk rows of an EAGLE-3-style head are fused to [n, H] first."""
        if self.m.fc is not None and h_rows.dim() == 2 and h_rows.shape[1] != self.hidden_size:
            h_rows = self._fused(h_rows)
        if h_rows.dim() != 2 or h_rows.shape[0] != len(tokens) or h_rows.shape[1] != self.hidden_size:
            raise ValueError(
                f"the NextN head needs one trunk hidden row of width {self.hidden_size} per token "
                f"(got {tuple(h_rows.shape)} for {len(tokens)} tokens; are feature taps set?)"
            )
        if not tokens:
            raise ValueError("no tokens to feed the NextN head")
        if start == 0 and (len(tokens) > 1 or not want_last):
            tokens, h_rows, start = tokens[1:], h_rows[1:], 1  # position 0 has no predecessor row
            if not tokens:
                self._place(1)
                return None
        self._place(start)
        self.counts.add(len(tokens))
        return tokens, h_rows, start

    def _advance_native(self, tokens: list[int], h_rows: torch.Tensor, start: int, *, want_last: bool):
        """``_advance`` on the compiled kernels, in one native call: (the head's output for the
        last row [H], its draft-vocabulary logits [K]) when ``want_last``, else (None, None)."""
        fed = self._inputs(tokens, h_rows, start, want_last)
        if fed is None:
            return None, None
        tokens, h_rows, start = fed
        at = start - self.base
        self._native.ensure(at + len(tokens), self.max_context)
        out = self._native.step(tokens, h_rows, at, self.base, want_last=want_last)
        self.end = start + len(tokens)
        return out

    @torch.inference_mode()
    def _advance(self, tokens: list[int], h_rows: torch.Tensor, start: int, *, want_last: bool):
        """Feed the rows (the torch module); the head's output for the last one ([H]) when
        ``want_last``."""
        fed = self._inputs(tokens, h_rows.float(), start, want_last)
        if fed is None:
            return None
        tokens, h_rows, start = fed
        n = len(tokens)
        at = start - self.base
        if self._native is not None:  # the per-op kernels path (the one-call path's reference)
            self._native.ensure(at + n, self.max_context)
            out = self._native.forward(tokens, h_rows, at, self.base, want_last=want_last)
            self.end = start + n
            return out
        self._ensure(at + n)
        with _single_thread():
            m = self.m
            emb = self.target.embed(tokens).float()  # [n, H]
            u = m.inputs(emb, h_rows)  # [n, H]
            q, k, v = m.qkv(u, None, self._rope(start, n))  # [n, heads, hd]
            self._k[at : at + n] = k
            self._v[at : at + n] = v
            keys, values = self._k[: at + n], self._v[: at + n]  # [at+n, nkv, hd]
            mask = None
            if n > 1:
                mask = torch.arange(at + n)[None, :] <= (at + torch.arange(n))[:, None]  # [n, at+n]
            attn = m.attend(q.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), mask)[0]  # [n, nh*hd]
            self.end = start + n
            return m.finish(u, attn)[-1]  # [H]

    def _rope(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [n, 1, hd/2] for positions start.., from a table grown on demand."""
        if start + n > self._rope_size:
            size = max(start + n, 2 * self._rope_size, 512)
            cfg = self.m.cfg
            self._cos, self._sin = rope_tables(torch.arange(size), cfg.head_dim, cfg.rope_theta)
            self._rope_size = size
        return self._cos[start : start + n], self._sin[start : start + n]


_refusals_warned: set[str] = set()


def _warn_layer_refusal(module: NextNModule, path: str) -> None:
    """One line on stderr (once per file and process) when the compiled kernels are there but
    cannot run this layer shape: the torch module drafts (slower, never silently)."""
    import sys

    from tsspec_gguf import native

    from .native_head import layer_refusal

    why = layer_refusal(module)
    if why is not None and native.available() and switch_on(NATIVE_ENV) and path not in _refusals_warned:
        _refusals_warned.add(path)
        print(f"tsspec: warning: {path}: the compiled NextN head has no {why}; the torch module drafts "
              "(slower, same output)", file=sys.stderr)


def check_fit(target_facts: dict, module: NextNModule, target, path: str) -> None:
    """ModelLoadError when the drafter cannot serve ``target``."""
    cfg = target.config
    if not callable(getattr(target, "embed", None)):
        raise ModelLoadError(path, f"the target ({cfg.architecture}) does not expose embed, which a NextN drafter borrows")
    if module.cfg.shared_head and not callable(getattr(target, "lm_head", None)):
        raise ModelLoadError(path, f"the target ({cfg.architecture}) does not expose lm_head, which this drafter's shared head borrows")
    if int(cfg.hidden_size) != module.cfg.hidden_size:
        raise ModelLoadError(
            path, f"drafter width {module.cfg.hidden_size} differs from the target's hidden size {cfg.hidden_size}: "
            "this drafter was trained for another model"
        )
    if int(cfg.vocab_size) != int(target_facts["vocab_size"]):
        raise ModelLoadError(
            path, f"drafter vocabulary ({target_facts['vocab_size']} tokens) does not match the target's ({cfg.vocab_size})"
        )
    if target_facts["architecture"] != cfg.architecture:
        raise ModelLoadError(
            path, f"drafter was trained for a {target_facts['architecture']!r} model, not {cfg.architecture!r}"
        )


def attach_nextn(target, gguf_path, options=None) -> NextNFileHead:
    """Read a ``nextn`` file, check it against ``target``, and make it ``target.draft_head``."""
    path = str(gguf_path)
    module, facts, _ = read_nextn(path)
    check_fit(facts, module, target, path)
    layers = list(module.cfg.feature_layers)
    if layers:  # an EAGLE-3-style head reads the residuals entering its layers: the target taps them
        from tsspec.capabilities import target_info

        if not target_info(target).feature_taps:
            raise ModelLoadError(path, f"the target ({target.config.architecture}) cannot tap layers {layers}, "
                                 "which this EAGLE-3-style drafter reads")
        try:
            target.spec_set_feature_taps(layers)
        except ValueError as exc:
            raise ModelLoadError(path, f"the target refused feature taps {layers}: {exc}") from None
        width = int(target.spec_feature_size)
        if width != module.fc.shape[1]:
            target.spec_set_feature_taps(None)
            raise ModelLoadError(path, f"with taps {layers} the target's rows are {width} wide; the drafter reads "
                                 f"{module.fc.shape[1]}")
    elif getattr(target, "feature_taps", None):
        target.spec_set_feature_taps(None)  # a NextN head reads the post-norm rows
    # drafting on the CPU: the head's matrices as int8 blocks on the compiled kernels (a quarter
    # of the float32 bytes per draft step; the drafts may differ slightly, the output never):
    # the native engine quantises its own, the torch one packs the module (use_native)
    module.sort_draft_vocab()
    if module.cfg.shared_head:
        module.borrow_head(target.lm_head)
    _warn_layer_refusal(module, path)
    head = NextNFileHead(module, target, source=path, max_context=int(getattr(target, "max_context_length", 1 << 16)),
                         recommended=facts.get("recommended"))
    target.draft_head = head
    return head
