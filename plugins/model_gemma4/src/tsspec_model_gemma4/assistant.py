"""The Gemma 4 assistant (HF ``Gemma4AssistantForCausalLM``) as a per-token draft head.

A step for token ``t`` at position ``P`` (the newest emitted token, not yet cached) with the
carried row ``h`` (the target's final-norm row that predicted ``t``, or the last step's state)::

    x = W_pre [embed_target(t) * sqrt(H_target); h];  layers: queries only, over the target's
    K/V of its last own-KV layer of each type (rows 0 .. P - 1; sliding: the newest window + 1)
    y = norm(x);  logits = E y (or the centroid-masked head);  h' = W_post y   # h' chains on

Every step of a chain keeps position ``P`` (transformers' candidate generator does). ``P`` is the
target's ``cache_seq_len``: after a partial accept it excludes the rejected rows, never read.
No state of its own: nothing to catch up, it resumes after any gap (``resumes_after_gap``, so it
arms after a reused prefix). Rows it needs: the trunk's hidden row (``needs_hidden_state``).
"""

from __future__ import annotations

import os

import torch

from tsspec.errors import ModelLoadError
from tsspec.protocols import DraftHeadKind
from tsspec_gguf import native
from tsspec_gguf.gguf_file import GGUFFile

from .hparams import ASSISTANT_ARCH, read_hparams
from .rope import RotaryTable
from .rows import Linear, gelu, rms
from .target import attend
from .weights import layer_weights, rope_factors


class Gemma4Assistant:
    """See the module docstring; ``attach_assistant`` builds it."""

    kind = DraftHeadKind.PER_TOKEN
    block_size = 1
    resumes_after_gap = True  # no state of its own: it reads the target's committed K/V
    auto_fallback = False

    def __init__(self, target, hp, weights: dict, *, source: str | None = None):
        self.target = target
        self.hparams = hp
        self.source = source
        self.vocab_size = hp.vocab_size
        self.counts = None
        self._w = weights
        dtype = torch.float64 if weights["embed"].dtype == torch.float64 else torch.float32
        self._res = dtype
        self._rope = {
            True: RotaryTable(hp.head_dim_swa, hp.rope_base_swa, hp.rope_dims_swa, None, dtype),
            False: RotaryTable(hp.head_dim_full, hp.rope_base, hp.head_dim_full, weights.get("rope_factors"), dtype),
        }

    def reset(self) -> None:
        """Nothing to drop: the head keeps no sequence state."""

    def draft_catch_up(self, tokens, h_rows, start_pos: int) -> None:
        """Nothing to catch up: the target's K/V already holds every committed row."""

    @torch.inference_mode()
    def draft_step(self, token: int, h_prev: torch.Tensor, pos: int):
        """(logits [vocab], h_out [H_target]) for the token after ``token``; see the module
        docstring (the query stays at the target's committed length, whatever ``pos``)."""
        hp, w = self.hparams, self._w
        P = int(self.target.cache_seq_len)
        if P < 1:
            raise ValueError("the assistant drafts after a prefill (the target's cache is empty)")
        emb = self.target.embed_scaled([int(token)]).to(self._res)  # [1, Hb]
        x = w["pre"](torch.cat([emb, h_prev.reshape(1, -1).to(self._res)], dim=-1)).to(self._res)  # [1, H]
        position = torch.tensor([P])
        for i, layer in enumerate(w["layers"]):
            sliding, hd = hp.sliding[i], hp.head_dim(i)
            h = rms(x, layer["attn_norm"], hp.rms_eps)
            q = rms(layer["wq"](h).to(self._res).reshape(1, hp.n_heads, hd), layer["q_norm"], hp.rms_eps)
            q = self._rope[sliding].apply(q, position)
            keys, values = self.target.committed_kv(sliding, P)  # [nkv, P, hd]
            first = max(0, P - hp.sliding_window - 1) if sliding else 0
            a = attend(q[0], keys[:, first:].to(self._res), values[:, first:].to(self._res)).reshape(1, -1)
            x = x + rms(layer["wo"](a).to(self._res), layer["post_attn_norm"], hp.rms_eps)
            g = rms(x, layer["ffn_norm"], hp.rms_eps)
            m = layer["w_down"](gelu(layer["w_gate"](g).to(self._res)) * layer["w_up"](g).to(self._res)).to(self._res)
            x = (x + rms(m, layer["post_ffn_norm"], hp.rms_eps)) * layer["scale"]
        y = rms(x, w["output_norm"], hp.rms_eps)  # [1, H]
        h_out = w["post"](y).to(self._res)[0]  # [Hb]
        return self._logits(y[0]), h_out

    def _logits(self, y: torch.Tensor) -> torch.Tensor:
        """[vocab] logits of the normed row y [H]: every row of the tied head, or the
        centroid-masked head's selected rows."""
        w = self._w
        embed = w["embed"]  # [V, H]
        if w.get("centroids") is None:
            return torch.mv(embed, y)
        top = torch.topk(torch.mv(w["centroids"], y), w["top_k"]).indices  # [k]
        canon = w["ordering"].view(w["centroids"].shape[0], -1)[top].reshape(-1)  # [k * V / C]
        scored = torch.mv(embed[canon], y)
        out = torch.full((embed.shape[0],), float(scored.min()) - 1.0, dtype=y.dtype)
        out[canon] = scored
        return out


def _check_fits(path: str, hp, target) -> None:
    """The assistant must read this target's K/V and hidden rows: a ModelLoadError otherwise."""
    thp = getattr(target, "hparams", None)
    if thp is None or not callable(getattr(target, "committed_kv", None)):
        raise ModelLoadError(path, "a gemma4-assistant drafts for a gemma4 target only")
    problems = []
    if hp.backbone_size != thp.hidden_size:
        problems.append(f"embedding_length_out {hp.backbone_size} != the target's hidden size {thp.hidden_size}")
    if hp.vocab_size != thp.vocab_size:
        problems.append(f"vocabulary {hp.vocab_size} != the target's {thp.vocab_size}")
    if (hp.head_dim_swa, hp.head_dim_full) != (thp.head_dim_swa, thp.head_dim_full):
        problems.append(f"head dims {hp.head_dim_swa}/{hp.head_dim_full} != the target's "
                        f"{thp.head_dim_swa}/{thp.head_dim_full}")
    for i in range(hp.n_layers):
        store = thp.store_layer(hp.sliding[i])
        if store is None:
            problems.append(f"layer {i} reads a {'sliding' if hp.sliding[i] else 'full'} layer the target lacks")
        elif thp.n_kv[store] != hp.n_kv[i]:
            problems.append(f"layer {i} has {hp.n_kv[i]} KV heads, the target's layer {store} {thp.n_kv[store]}")
    if problems:
        raise ModelLoadError(path, "does not fit this target: " + "; ".join(problems[:3]))


def _ordering(gf, vocab: int) -> torch.Tensor:
    """``masked_embd_ordering`` [V] as ids: I32 as written by llama.cpp's tools, or float32
    (exact below 2**24, what tsspec's writer stores); a permutation of the vocabulary."""
    info = gf.tensor_info("masked_embd_ordering")
    if getattr(info.ggml_type, "name", "") == "I32":
        ids = torch.from_numpy(gf.tensor_bytes("masked_embd_ordering").view("<i4").copy()).to(torch.long)
    else:
        values = gf.tensor("masked_embd_ordering", torch.float64).reshape(-1)
        ids = values.to(torch.long)
        if not torch.equal(ids.to(torch.float64), values):
            raise ModelLoadError(gf.path, "masked_embd_ordering holds non-integer ids")
    if not torch.equal(torch.sort(ids).values, torch.arange(vocab)):
        raise ModelLoadError(gf.path, "masked_embd_ordering is not a permutation of the vocabulary")
    return ids


def attach_assistant(target, source, options=None) -> Gemma4Assistant:
    """Read a ``gemma4-assistant`` GGUF and bind it to ``target`` (registered drafter attach)."""
    path = os.fspath(getattr(source, "path", source))
    dtype = getattr(target, "dtype", torch.float32)
    blocks = dtype == torch.float32 and native.available()  # as the target's default path
    vdtype = torch.float64 if dtype == torch.float64 else torch.float32
    with GGUFFile(path) as gf:
        if gf.architecture != ASSISTANT_ARCH:
            raise ModelLoadError(path, f"architecture {gf.architecture!r} is not {ASSISTANT_ARCH!r}")
        hp = read_hparams(gf)
        _check_fits(path, hp, target)
        H, Hb, V = hp.hidden_size, hp.backbone_size, hp.vocab_size
        gf.check_tensor("nextn.pre_projection.weight", (H, 2 * Hb))
        gf.check_tensor("nextn.post_projection.weight", (Hb, H))
        weights: dict = {
            "embed": gf.require_tensor("token_embd.weight", (V, H)).to(vdtype).contiguous(),
            "output_norm": gf.require_tensor("output_norm.weight", (H,)).to(vdtype),
            "pre": Linear(gf, ["nextn.pre_projection.weight"], dtype, blocks),
            "post": Linear(gf, ["nextn.post_projection.weight"], dtype, blocks),
            "layers": [layer_weights(hp, gf, i, dtype, blocks, vdtype) for i in range(hp.n_layers)],
            "rope_factors": rope_factors(hp, gf),
            "centroids": None,
            "top_k": 0,
        }
        if gf.has_tensor("masked_embd_centroids.weight"):
            C = int(gf.get(gf.arch_key("num_centroids"), gf.tensor_shape("masked_embd_centroids.weight")[0]))
            k = int(gf.get(gf.arch_key("centroid_intermediate_top_k"), 32))
            if V % C or not 1 <= k <= C:
                raise ModelLoadError(path, f"{C} centroids with top-{k} do not partition a vocabulary of {V}")
            weights["centroids"] = gf.require_tensor("masked_embd_centroids.weight", (C, H)).to(vdtype)
            gf.check_tensor("masked_embd_ordering", (V,))
            weights["ordering"] = _ordering(gf, V)
            weights["top_k"] = k
    return Gemma4Assistant(target, hp, weights, source=path)
