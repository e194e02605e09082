"""transformers' Gemma 4 made a float64 oracle.

HF computes three things in float32 even in a float64 model: RMSNorm (``hidden.float()``),
the attention and router softmax (``dtype=torch.float32``) and RoPE (``position_ids.float()``,
float32 ``inv_freq`` buffers). ``float64_oracle`` runs them in the input's dtype and sets the
RoPE frequencies to their float64 values (same formula); nothing else changes. It runs
on one torch thread (restored after).
"""

from __future__ import annotations

import contextlib

import torch
from transformers.models.gemma4 import modeling_gemma4 as mg


def _norm_forward(self, x):
    out = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon, -0.5)
    return out * self.weight if self.with_scale else out


def _rope_forward(self, x, position_ids, layer_type):
    inv = getattr(self, f"{layer_type}_inv_freq").to(torch.float64)
    freqs = position_ids[..., None].to(torch.float64) * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _exact_inv_freq(model) -> None:
    """The rotary buffers recomputed in float64 (HF's formula, default and proportional)."""
    rotary = getattr(model, "rotary_emb", None)
    config = model.config
    for layer_type in ("sliding_attention", "full_attention"):
        name = f"{layer_type}_inv_freq"
        if rotary is None or not hasattr(rotary, name):
            continue
        params = config.rope_parameters[layer_type]
        hd = int(config.per_layer_config[layer_type].head_dim)
        j = torch.arange(hd // 2, dtype=torch.float64)
        inv = params["rope_theta"] ** (-2.0 * j / hd)
        if params.get("rope_type") == "proportional":
            inv[int(params.get("partial_rotary_factor", 1.0) * hd // 2):] = 0.0
        getattr(rotary, name).copy_(inv)


@contextlib.contextmanager
def float64_oracle(*models):
    softmax = torch.nn.functional.softmax

    def softmax64(x, dim=None, dtype=None, **kw):
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype, **kw)

    saved = (mg.Gemma4RMSNorm.forward, mg.Gemma4TextRotaryEmbedding.forward)
    mg.Gemma4RMSNorm.forward = _norm_forward
    mg.Gemma4TextRotaryEmbedding.forward = _rope_forward
    torch.nn.functional.softmax = softmax64
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a thread pool's wake-ups cost more than the work
    try:
        for model in models:
            for module in model.modules():
                if isinstance(module, mg.Gemma4TextModel):
                    _exact_inv_freq(module)
        yield
    finally:
        mg.Gemma4RMSNorm.forward, mg.Gemma4TextRotaryEmbedding.forward = saved
        torch.nn.functional.softmax = softmax
        torch.set_num_threads(threads)
