"""BlockDrafterModule: the DFlash drafter as a trainable torch module, and its export.

The same math as ``head.DFlashDraftHead`` (passes A, B and C; see there), batched over many
blocks of many sequences in one forward, which is how DFlash is trained:

* pass A/B once per sequence: ``c = RMSNorm(fc @ taps)`` for every position, and per layer the
  context keys ``rope(k_norm(W_k c))`` and values ``W_v c`` at their positions;
* pass C for every anchor at once: the block ``[anchor, MASK x (B-1)]`` at positions
  ``a .. a+B-1``; a block row sees the context keys of positions ``< a`` (within the sliding
  window, when one is set) and the rows of its own block (non-causal), never another block.

The embedding is the target's (frozen rows passed in); the LM head is the draft vocabulary's
rows of the target's head (frozen). ``export`` turns the module into the ``DFlashConfig`` /
``DFlashWeights`` the block algorithm loads, and ``write_trained_dflash`` writes the GGUF in the
existing ``dflash`` layout plus ``dflash.draft_vocab`` and ``output.weight`` (the K head rows).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import MASK_TOKEN_KEY, DFlashConfig
from .ops import rms_norm, rope_neox, swiglu
from .weights import DRAFT_HEAD_TENSOR, DFlashWeights, LayerWeights

__all__ = ["BlockDrafterModule", "write_trained_dflash", "read_manifest", "init_uniform", "LAYER_PARAMS"]

# per-layer parameter -> (GGUF name under blk.N., kind): "matrix" or "norm"
LAYER_PARAMS = {
    "attn_norm": ("attn_norm.weight", "norm"),
    "wq": ("attn_q.weight", "matrix"),
    "wk": ("attn_k.weight", "matrix"),
    "wv": ("attn_v.weight", "matrix"),
    "wo": ("attn_output.weight", "matrix"),
    "q_norm": ("attn_q_norm.weight", "norm"),
    "k_norm": ("attn_k_norm.weight", "norm"),
    "ffn_norm": ("ffn_norm.weight", "norm"),
    "w_gate": ("ffn_gate.weight", "matrix"),
    "w_up": ("ffn_up.weight", "matrix"),
    "w_down": ("ffn_down.weight", "matrix"),
}
OUTTYPES = ("f32", "f16", "q8_0")


def _layer_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    H, Fd, nh, nkv, hd, vd = cfg.hidden_size, cfg.ffn_size, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.value_dim
    return {
        "attn_norm": (H,), "wq": (nh * hd, H), "wk": (nkv * hd, H), "wv": (nkv * vd, H), "wo": (H, nh * vd),
        "q_norm": (hd,), "k_norm": (hd,), "ffn_norm": (H,), "w_gate": (Fd, H), "w_up": (Fd, H), "w_down": (H, Fd),
    }


class _Layer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        for name, shape in _layer_shapes(cfg).items():
            init = torch.ones(shape) if LAYER_PARAMS[name][1] == "norm" else torch.zeros(shape)
            self.register_parameter(name, nn.Parameter(init))


class BlockDrafterModule(nn.Module):
    """A trainable DFlash drafter (no conv, no selector) with a draft-vocabulary LM head."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        if cfg.has_conv or cfg.has_selector:
            raise ValueError("the trainable drafter is plain DFlash (no DFlash2 conv or selector)")
        if not cfg.draft_vocab:
            raise ValueError("the trainable drafter needs a draft vocabulary (its LM-head rows)")
        self.cfg = cfg
        H = cfg.hidden_size
        self.fc = nn.Parameter(torch.zeros(H, cfg.feature_size))  # [H, taps*H_target]
        self.enc_norm = nn.Parameter(torch.ones(H))
        self.out_norm = nn.Parameter(torch.ones(H))
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.num_layers))
        K = len(cfg.draft_vocab)
        self.head = nn.Parameter(torch.zeros(K, H), requires_grad=False)  # [K, H] frozen target rows
        self.register_buffer("draft_ids", torch.tensor(cfg.draft_vocab, dtype=torch.long), persistent=False)

    # -- forward ---------------------------------------------------------------------------
    def context(self, features: torch.Tensor) -> torch.Tensor:
        """Pass A: [b, L, F] tapped rows -> [b, L, H] encoded context."""
        return rms_norm(F.linear(features, self.fc), self.enc_norm, self.cfg.eps)

    def _visible(self, anchors: torch.Tensor, length: int, layer: int) -> torch.Tensor:
        """[b, n*B, L + n*B] bool: block rows see context positions < anchor (and within the
        window) and their own block."""
        cfg, B = self.cfg, self.cfg.block_size
        b, n = anchors.shape
        dev = anchors.device
        q_pos = (anchors[:, :, None] + torch.arange(B, device=dev)).reshape(b, n * B)  # [b, n*B]
        q_anchor = anchors[:, :, None].expand(b, n, B).reshape(b, n * B)
        ctx_pos = torch.arange(length, device=dev)  # [L]
        see_ctx = ctx_pos[None, None, :] < q_anchor[:, :, None]  # [b, n*B, L]
        block_id = torch.arange(n, device=dev).repeat_interleave(B)  # [n*B]
        see_block = (block_id[:, None] == block_id[None, :]).expand(b, n * B, n * B)
        if cfg.layer_is_sliding(layer):
            w = int(cfg.sliding_window)
            see_ctx = see_ctx & ((q_pos[:, :, None] - ctx_pos[None, None, :]).abs() <= w)
            k_pos = q_pos
            see_block = see_block & ((q_pos[:, :, None] - k_pos[:, None, :]).abs() <= w)
        return torch.cat([see_ctx, see_block], dim=-1)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
                embed: torch.Tensor) -> torch.Tensor:
        """Drafter rows [b, n, B, H] after the final norm.

        features [b, L, F] tapped rows; tokens [b, L]; anchors [b, n] positions (each >= 1 and
        < L); embed [V, H] the target's embedding rows (frozen)."""
        cfg, B = self.cfg, self.cfg.block_size
        b, L, _ = features.shape
        n = anchors.shape[1]
        nh, nkv, hd, vd = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.value_dim
        dev = features.device
        c = self.context(features)  # [b, L, H]
        ids = torch.full((b, n, B), cfg.mask_token_id, dtype=torch.long, device=dev)
        ids[:, :, 0] = torch.gather(tokens, 1, anchors)
        x = embed[ids]  # [b, n, B, H]
        q_pos = (anchors[:, :, None] + torch.arange(B, device=dev)).reshape(-1)  # [b*n*B]
        ctx_pos = torch.arange(L, device=dev).repeat(b)  # [b*L]
        scale = hd**-0.5
        for index, lw in enumerate(self.layers):
            # pass B: context keys / values (from c, the same for every layer input)
            kc = F.linear(c, lw.wk).reshape(b * L, nkv, hd)
            kc = rope_neox(rms_norm(kc, lw.k_norm, cfg.eps), ctx_pos, cfg.rope_base).reshape(b, L, nkv, hd)
            vc = F.linear(c, lw.wv).reshape(b, L, nkv, vd)
            # pass C: the blocks
            h = rms_norm(x, lw.attn_norm, cfg.eps).reshape(b * n * B, -1)  # [b*n*B, H]
            q = rope_neox(rms_norm(F.linear(h, lw.wq).view(-1, nh, hd), lw.q_norm, cfg.eps), q_pos, cfg.rope_base)
            kb = rope_neox(rms_norm(F.linear(h, lw.wk).view(-1, nkv, hd), lw.k_norm, cfg.eps), q_pos, cfg.rope_base)
            vb = F.linear(h, lw.wv).view(-1, nkv, vd)
            keys = torch.cat([kc, kb.view(b, n * B, nkv, hd)], dim=1)  # [b, L+n*B, nkv, hd]
            values = torch.cat([vc, vb.view(b, n * B, nkv, vd)], dim=1)
            visible = self._visible(anchors, L, index)  # [b, n*B, L+n*B]
            attn = F.scaled_dot_product_attention(
                q.view(b, n * B, nh, hd).transpose(1, 2),  # [b, nh, n*B, hd]
                keys.transpose(1, 2), values.transpose(1, 2),
                attn_mask=visible[:, None], scale=scale, enable_gqa=nh != nkv,
            )  # [b, nh, n*B, vd]
            attn = attn.transpose(1, 2).reshape(b, n, B, nh * vd)
            x = x + F.linear(attn, lw.wo)
            x = x + swiglu(rms_norm(x, lw.ffn_norm, cfg.eps), lw.w_gate, lw.w_up, lw.w_down)
        return rms_norm(x, self.out_norm, cfg.eps)

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., K] over the draft vocabulary."""
        return F.linear(rows, self.head)

    # -- export ----------------------------------------------------------------------------
    def export(self) -> DFlashWeights:
        """The module's tensors as the block algorithm's ``DFlashWeights`` (float32, CPU)."""

        def t(p: torch.Tensor) -> torch.Tensor:
            return p.detach().float().cpu().clone()

        layers = tuple(LayerWeights(**{name: t(getattr(lw, name)) for name in LAYER_PARAMS}) for lw in self.layers)
        return DFlashWeights(fc=t(self.fc), enc_norm=t(self.enc_norm), out_norm=t(self.out_norm), layers=layers,
                             draft_head=t(self.head))


def _metadata(cfg: DFlashConfig) -> dict[str, Any]:
    from gguf import GGUFValueType

    a = "dflash."
    meta: dict[str, Any] = {
        a + "block_count": cfg.num_layers,
        a + "embedding_length": cfg.hidden_size,
        a + "feed_forward_length": cfg.ffn_size,
        a + "attention.head_count": cfg.n_head,
        a + "attention.head_count_kv": cfg.n_head_kv,
        a + "attention.key_length": cfg.head_dim,
        a + "attention.value_length": cfg.value_dim,
        a + "rope.freq_base": float(cfg.rope_base),
        a + "attention.layer_norm_rms_epsilon": float(cfg.eps),
        a + "block_size": cfg.block_size,
        a + "target_layers": ([int(v) for v in cfg.target_layers], (GGUFValueType.ARRAY, GGUFValueType.UINT32)),
        a + "target_hidden_size": cfg.target_hidden_size,
        a + "draft_vocab": ([int(v) for v in cfg.draft_vocab or ()], (GGUFValueType.ARRAY, GGUFValueType.INT32)),
        MASK_TOKEN_KEY: cfg.mask_token_id,
    }
    if cfg.vocab_size is not None:
        meta[a + "vocab_size"] = int(cfg.vocab_size)
    if cfg.sliding_window:
        meta[a + "attention.sliding_window"] = int(cfg.sliding_window)
        meta[a + "attention.sliding_window_pattern"] = [bool(cfg.layer_is_sliding(i)) for i in range(cfg.num_layers)]
    return meta


def write_trained_dflash(path, module: BlockDrafterModule, *, target: dict[str, Any], manifest: dict | None = None,
                         outtype: str = "f16") -> str:
    """Write ``module`` as a ``dflash`` GGUF the block algorithm loads. Matrices in ``outtype``
    (q8_0 where the row length allows it), norms float32. ``target``: architecture,
    shape_digest, sha256 of the model it was trained on (metadata ``dflash.target.*``)."""
    from gguf import GGMLQuantizationType

    from tsspec_gguf.gguf_writer import write_gguf

    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    cfg = module.cfg

    def matrix(value: torch.Tensor):
        array = value.detach().float().cpu().numpy()
        if outtype == "q8_0" and array.shape[-1] % 32 == 0:
            return (array, GGMLQuantizationType.Q8_0)
        return array.astype(np.float16) if outtype in ("f16", "q8_0") else array.astype(np.float32)

    def norm(value: torch.Tensor):
        return value.detach().float().cpu().numpy().astype(np.float32)

    tensors: dict[str, Any] = {"fc.weight": matrix(module.fc), "enc.output_norm.weight": norm(module.enc_norm),
                               "output_norm.weight": norm(module.out_norm), DRAFT_HEAD_TENSOR: matrix(module.head)}
    for i, lw in enumerate(module.layers):
        for name, (gguf_name, kind) in LAYER_PARAMS.items():
            value = getattr(lw, name)
            tensors[f"blk.{i}.{gguf_name}"] = matrix(value) if kind == "matrix" else norm(value)
    meta = _metadata(cfg)
    for key in ("architecture", "shape_digest", "sha256"):
        meta[f"dflash.target.{key}"] = str(target.get(key, "") or "")
    meta["general.name"] = f"DFlash drafter for {target.get('name') or target.get('architecture', 'a target')}"
    meta["tsspec.training.manifest"] = json.dumps(manifest or {}, sort_keys=True)
    return write_gguf(path, "dflash", meta, tensors)


def read_manifest(path) -> dict:
    """The training manifest a trained drafter carries ({} when none)."""
    from tsspec_gguf.gguf_file import GGUFFile

    with GGUFFile(str(path)) as f:
        text = f.get("tsspec.training.manifest", "") or ""
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}


def init_uniform(p: torch.Tensor, generator: torch.Generator, gain: float = 1.0) -> None:
    """Normal(0, gain^2 / fan_in) in place (fan_in = the last dim)."""
    with torch.no_grad():
        p.copy_(torch.randn(p.shape, generator=generator) * (gain / math.sqrt(p.shape[-1])))
