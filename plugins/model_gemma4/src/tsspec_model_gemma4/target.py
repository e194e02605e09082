"""``Gemma4Target``: the Gemma 4 text trunk (HF ``Gemma4TextDecoderLayer``) as a SpeculativeTarget.

One layer (every norm RMSNorm ``x_hat * w``; attention scale 1)::

    q = rope(q_norm(W_q attn_norm(x))); k = rope(k_norm(W_k .)); v = rms(W_v . or the raw K)
    x = x + post_attention_norm(W_o attend(q, K, V))   # KV-shared layers read an earlier layer's
    x = x + post_ffw_norm(MLP(ffn_norm(x)) [+ MoE branch])   # K/V; sliding layers a window
    x = x + post_norm(W_proj(gelu(W_gate' x) * pli_i));  x = x * layer_output_scale

Input ``embed * sqrt(H)`` and per-layer inputs ``pli``; output the final norm, the tied head and
``tanh(z / cap) * cap``. The cache keeps every position (the window is a mask), so rewinds are
exact. Row invariance: ``rows.Linear``, norms and transcendental ops row by row, one attention
query row at a time: a k-row verify equals k one-row decodes bit for bit. The assistant reads
``embed_scaled`` and ``committed_kv``. The README has the details.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from tsspec.errors import GenerationError
from tsspec.protocols import ModelConfig

from .hparams import Gemma4HParams
from .rope import RotaryTable
from .rows import Linear, gelu, rms, rowwise

INITIAL_CAPACITY = 256
# the guarantee `tsspec generate --stats` prints on its [lossless] line (docs/lossless.md)
LOSSLESS = ("bit-exact, greedy and seeded: every matrix row by row (block kernels, or one torch.mv a row), "
            "norms, GELU and softcap one row per call, attention one query row at a time")


def scale32(value: float) -> float:
    """A scale as HF and llama.cpp hold it: a float32 number (sqrt(H) as a float32 buffer)."""
    return float(torch.tensor(value, dtype=torch.float32))


def softcap(z: torch.Tensor, cap: float | None) -> torch.Tensor:
    return z if not cap else rowwise(lambda r: torch.tanh(r / cap) * cap, z)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One query row: q [nh, hd] over keys/values [nkv, n, hd] (scale 1) -> [nh * hd]."""
    nkv, n, hd = keys.shape
    qg = q.reshape(nkv, -1, 1, hd)  # [nkv, g, 1, hd]
    scores = (qg * keys[:, None]).sum(-1)  # [nkv, g, n] (products and sums: no BLAS thread pool)
    e = torch.exp(scores - scores.amax(-1, keepdim=True))  # softmax by hand: torch.softmax's
    probs = e / e.sum(-1, keepdim=True)  # kernel wakes the thread pool even at these sizes
    return (probs[..., None] * values[:, None]).sum(-2).reshape(-1)  # [nh * hd]


class Gemma4Target:
    """See the module docstring. Build it with ``tsspec_model_gemma4.load_gemma4``."""

    speculation_profitable = True  # drafter-independent trunk: ngram serves any checkpoint
    speculation_refusal: str | None = None
    spec_preferred_draft_window: int | None = None
    spec_verify_persists_accepted_kv = True
    # why draft-head declines while no assistant is attached (the no_draft_head reason)
    spec_draft_head_absence = "assistant missing: load the Gemma 4 assistant GGUF (gemma4-assistant)"

    def __init__(self, hparams: Gemma4HParams, weights: dict, *, tokenizer=None,
                 dtype: torch.dtype = torch.float32, path: str | None = None):
        self.hparams = hp = hparams
        self.path = path
        self.dtype = dtype
        self.tokenizer = tokenizer
        self.draft_head = None
        self._res = torch.float64 if dtype == torch.float64 else torch.float32
        self.config = ModelConfig(
            architecture=hp.arch, vocab_size=hp.vocab_size, hidden_size=hp.hidden_size, num_layers=hp.n_layers,
            context_length=hp.context_length,
            extra={**hp.as_extra(), "dtype": str(dtype).removeprefix("torch."), "lossless": LOSSLESS},
        )
        self._embed: torch.Tensor = weights["embed"]  # [V, H]
        self._head: Linear = weights["lm_head"]
        self._out_norm = weights["output_norm"]
        self._layers: list[dict] = weights["layers"]
        self._ple_embed = weights.get("ple_embed")  # [Vp, L * P]
        self._ple_proj: Linear | None = weights.get("ple_proj")
        self._ple_norm = weights.get("ple_norm")
        self._embed_scale = scale32(hp.hidden_size**0.5)
        self._ple_scale = scale32(hp.ple_dim**0.5) if hp.ple_dim else 0.0
        self._rope = {
            True: RotaryTable(hp.head_dim_swa, hp.rope_base_swa, hp.rope_dims_swa, None, self._res),
            False: RotaryTable(hp.head_dim_full, hp.rope_base, hp.head_dim_full, weights.get("rope_factors"), self._res),
        }
        self._source = hp.kv_source
        self._seq_len = 0
        self._last_start = 0
        self._capacity = 0
        self._k: dict[int, torch.Tensor] = {}  # own-KV layer -> [nkv, capacity, hd]
        self._v: dict[int, torch.Tensor] = {}

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def cache_seq_len(self) -> int:
        return self._seq_len

    @property
    def max_context_length(self) -> int:
        return self.hparams.context_length

    @property
    def spec_feature_size(self) -> int:
        return self.hparams.hidden_size

    def spec_set_feature_taps(self, layers: Sequence[int] | None) -> None:
        if layers:
            raise GenerationError("the gemma4 target offers no feature taps (its hidden row is the final norm's)")

    # -- KV cache and rollback -----------------------------------------------------------------
    def spec_ensure_capacity(self, required_seq_len: int) -> None:
        if required_seq_len > self.max_context_length:
            raise GenerationError(f"{required_seq_len} tokens exceed the model's context of {self.max_context_length}")
        if required_seq_len <= self._capacity:
            return
        hp = self.hparams
        capacity = min(self.max_context_length, max(required_seq_len, 2 * self._capacity, INITIAL_CAPACITY))
        for i in range(hp.first_shared):
            shape = (hp.n_kv[i], capacity, hp.head_dim(i))
            for cache in (self._k, self._v):
                grown = torch.zeros(shape, dtype=self._res)
                if i in cache and self._seq_len:
                    grown[:, : self._seq_len] = cache[i][:, : self._seq_len]
                cache[i] = grown
        self._capacity = capacity

    def spec_rewind_cache(self, length: int) -> None:
        if not 0 <= length <= self._seq_len:
            raise ValueError(f"cannot rewind a cache of {self._seq_len} tokens to {length}")
        self._seq_len = length
        self._last_start = min(self._last_start, length)

    def spec_keep(self, rows_kept: int) -> None:
        """Keep the state after the first ``rows_kept`` rows of the last forward: sets the length
        (every key is kept; rows past it are never read again)."""
        rows = self._seq_len - self._last_start
        if not 1 <= rows_kept <= rows:
            raise ValueError(f"cannot keep {rows_kept} rows of a forward of {rows}")
        self._seq_len = self._last_start + int(rows_kept)

    def reset(self) -> None:
        self.spec_rewind_cache(0)

    def state_fingerprint(self) -> tuple:
        """(length, every own-KV layer's K and V up to it): what ``assert_lossless`` compares
        between a plain and a speculative run."""
        n = self._seq_len
        return (n, *(cache[i][:, :n].clone() for cache in (self._k, self._v) for i in sorted(cache)))

    # -- one layer -----------------------------------------------------------------------------
    def _attention(self, i: int, h: torch.Tensor, past: int) -> torch.Tensor:
        hp, w = self.hparams, self._layers[i]
        rows, hd, sliding = h.shape[0], hp.head_dim(i), hp.sliding[i]
        positions = torch.arange(past, past + rows)
        rope = self._rope[sliding]
        q = rms(w["wq"](h).to(self._res).reshape(rows, hp.n_heads, hd), w["q_norm"], hp.rms_eps)
        q = rope.apply(q, positions)  # [rows, nh, hd]
        if "wk" in w:
            k_raw = w["wk"](h).to(self._res).reshape(rows, hp.n_kv[i], hd)
            v_raw = w["wv"](h).to(self._res).reshape(rows, hp.n_kv[i], hd) if w["wv"] is not None else k_raw
            k = rope.apply(rms(k_raw, w["k_norm"], hp.rms_eps), positions)
            self._k[i][:, past : past + rows] = k.transpose(0, 1)
            self._v[i][:, past : past + rows] = rms(v_raw, None, hp.rms_eps).transpose(0, 1)
        src = self._source[i]
        kc, vc = self._k[src], self._v[src]
        out = torch.empty(rows, hp.n_heads * hd, dtype=self._res)
        for t in range(rows):
            p = past + t
            first = max(0, p - hp.sliding_window + 1) if sliding else 0
            out[t] = attend(q[t], kc[:, first : p + 1], vc[:, first : p + 1])
        return rms(w["wo"](out).to(self._res), w["post_attn_norm"], hp.rms_eps)

    def _moe(self, w: dict, x: torch.Tensor) -> torch.Tensor:
        """The expert branch on the layer's input residual x [rows, H], one row at a time."""
        hp = self.hparams
        g = rms(x, w["pre_ffw_norm_2"], hp.rms_eps)
        r = rms(x, None, hp.rms_eps) * w["router_scale"] * (hp.hidden_size**-0.5)
        out = torch.zeros_like(x)
        F_ = hp.expert_ffn
        for t in range(x.shape[0]):
            z = w["router"](r[t : t + 1]).to(self._res)[0]  # [E]
            e = torch.exp(z - z.max())
            probs = e / e.sum()
            top_w, top_i = torch.topk(probs, hp.n_experts_used)
            top_w = top_w / top_w.sum() * w["expert_scale"][top_i]
            for slot in range(hp.n_experts_used):
                gate_up, down = w["experts"][int(top_i[slot])]
                gu = gate_up(g[t : t + 1]).to(self._res)
                out[t] += down(gelu(gu[:, :F_]) * gu[:, F_:]).to(self._res)[0] * top_w[slot]
        return rms(out, w["post_ffw_norm_2"], hp.rms_eps)

    def _layer(self, i: int, x: torch.Tensor, past: int, pli: torch.Tensor | None) -> torch.Tensor:
        hp, w = self.hparams, self._layers[i]
        x = x + self._attention(i, rms(x, w["attn_norm"], hp.rms_eps), past)
        g = rms(x, w["ffn_norm"], hp.rms_eps)
        m = w["w_down"](gelu(w["w_gate"](g).to(self._res)) * w["w_up"](g).to(self._res)).to(self._res)
        if hp.n_experts:
            m = rms(m, w["post_ffw_norm_1"], hp.rms_eps) + self._moe(w, x)
        x = x + rms(m, w["post_ffn_norm"], hp.rms_eps)
        if pli is not None:
            p = gelu(w["ple_gate"](x).to(self._res)) * pli[:, i]
            x = x + rms(w["ple_proj"](p).to(self._res), w["ple_norm"], hp.rms_eps)
        return x * w["scale"]

    def _per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
        hp = self.hparams
        if not hp.ple_dim:
            return None
        rows, L, P = x.shape[0], hp.n_layers, hp.ple_dim
        tok = (self._ple_embed[ids] * self._ple_scale).reshape(rows, L, P)
        proj = (self._ple_proj(x).to(self._res) * (hp.hidden_size**-0.5)).reshape(rows, L, P)
        return (rms(proj, self._ple_norm, hp.rms_eps) + tok) * (2.0**-0.5)  # [rows, L, P]

    # -- forward -------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward_residual(self, tokens: Sequence[int]) -> torch.Tensor:
        """Run the layers over ``tokens`` at cache_seq_len.. (their K/V appended); the final
        residual [rows, H] before the final norm."""
        rows = len(tokens)
        if rows == 0:
            raise ValueError("spec_forward needs at least one token")
        ids = torch.tensor([int(t) for t in tokens], dtype=torch.long)
        if int(ids.min()) < 0 or int(ids.max()) >= self.hparams.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.hparams.vocab_size})")
        past = self._seq_len
        self.spec_ensure_capacity(past + rows)
        x = self.embed_scaled(ids)
        pli = self._per_layer_inputs(ids, x)
        for i in range(self.hparams.n_layers):
            x = self._layer(i, x, past, pli)
        self._last_start, self._seq_len = past, past + rows
        return x

    @torch.inference_mode()
    def spec_forward(self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool):
        """logits [rows or 1, vocab]; hidden [rows, H] (the final norm's rows) or None."""
        x = self.forward_residual(tokens)
        normed = rms(x if (all_logits_rows or want_hidden) else x[-1:], self._out_norm, self.hparams.rms_eps)
        head_rows = normed if all_logits_rows else normed[-1:]
        logits = softcap(self._head(head_rows).to(self._res), self.hparams.softcap)
        return logits, (normed if want_hidden else None)

    # -- drafter-facing surface ----------------------------------------------------------------
    def embed_scaled(self, ids) -> torch.Tensor:
        """The input embedding rows [n, H]: ``embed * sqrt(H)``."""
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        return F.embedding(ids, self._embed).to(self._res) * self._embed_scale

    def committed_kv(self, sliding: bool, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) [nkv, length, hd] of the last own-KV layer of that type, positions
        ``0 .. length - 1`` (an assistant passes the committed length: never a rejected row)."""
        layer = self.hparams.store_layer(sliding)
        if layer is None:
            raise GenerationError(f"the target has no {'sliding' if sliding else 'full'} layer with its own K/V")
        if not 0 <= length <= self._seq_len:
            raise ValueError(f"{length} keys asked of a cache of {self._seq_len}")
        return self._k[layer][:, :length], self._v[layer][:, :length]

    def __repr__(self) -> str:
        hp = self.hparams
        return (f"Gemma4Target(layers={hp.n_layers} ({sum(hp.sliding)} sliding, {hp.n_kv_shared} KV-shared), "
                f"hidden={hp.hidden_size}, head dims={hp.head_dim_swa}/{hp.head_dim_full}, vocab={hp.vocab_size}, "
                f"{self.dtype})")
