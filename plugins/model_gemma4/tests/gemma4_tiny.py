"""Tiny random Gemma 4 checkpoints (transformers 5.25) converted to GGUF for the tests."""

from __future__ import annotations

import torch

from tsspec_model_gemma4.convert import assistant_gguf, gemma4_gguf, write  # noqa: F401 (tests use them)
from tsspec_model_gemma4.hparams import ARCH, ASSISTANT_ARCH

VOCAB = 128
TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
         "sliding_attention", "full_attention"]


def text_config(**over):
    from transformers import Gemma4TextConfig

    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=len(TYPES),
               num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64, sliding_window=4,
               layer_types=list(TYPES), hidden_size_per_layer_input=32, vocab_size_per_layer_input=VOCAB,
               num_kv_shared_layers=2, final_logit_softcapping=5.0, use_double_wide_mlp=True,
               attention_k_eq_v=True, num_global_key_value_heads=1, max_position_embeddings=256, rms_norm_eps=1e-6)
    cfg.update(over)
    config = Gemma4TextConfig(**cfg)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the grouped-mm path takes no float64
    return config


def _spread(model, seed: int) -> None:
    """Random weights with spread norms and layer scales (HF initialises norms to 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 or "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.8 + 0.4 * torch.rand(b.shape, generator=g, dtype=b.dtype))


def hf_target(seed: int = 0, dtype=torch.float64, **over):
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(text_config(**over)).eval()
    _spread(model, seed)
    return model.to(dtype)


def hf_assistant(seed: int = 1, dtype=torch.float64, ordered: bool = False, spread: bool = True, **over):
    from transformers.models.gemma4_assistant import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    text = dict(model_type="gemma4_text", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64, sliding_window=3,
                layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
                vocab_size_per_layer_input=0, attention_k_eq_v=True, num_global_key_value_heads=1,
                max_position_embeddings=256)
    text.update(over)
    config = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=64, use_ordered_embeddings=ordered,
                                   num_centroids=16, centroid_intermediate_top_k=4)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Gemma4AssistantForCausalLM(config).eval()
    if spread:
        _spread(model, seed)
    if ordered:
        g = torch.Generator().manual_seed(seed + 7)
        model.masked_embedding.token_ordering.copy_(torch.randperm(VOCAB, generator=g))
    return model.to(dtype)


def write_target(model, path, outtype: str = "f32") -> str:
    meta, tensors = gemma4_gguf(model.config.to_dict(), model.state_dict())
    return write(path, ARCH, meta, tensors, outtype)


def write_assistant(model, path, outtype: str = "f32") -> str:
    meta, tensors = assistant_gguf(model.config.to_dict(), model.state_dict())
    return write(path, ASSISTANT_ARCH, meta, tensors, outtype)


def write_echo_assistant(target_model, path) -> str:
    """An assistant built to agree with the target where it repeats itself: its layers add
    nothing (zero output projections), ``pre_projection`` passes the carried target row through
    and the head is the target's embedding, so it drafts the token the target's last row chose.
    Used to exercise accepted drafts (all accepted, then partial accepts) through the loop."""
    import numpy as np

    model = hf_assistant(hidden_size=64)
    meta, tensors = assistant_gguf(model.config.to_dict(), model.state_dict())
    _, trunk = gemma4_gguf(target_model.config.to_dict(), target_model.state_dict())
    H = 64
    tensors["nextn.pre_projection.weight"] = np.concatenate([np.zeros((H, H)), np.eye(H)], 1).astype(np.float32)
    tensors["nextn.post_projection.weight"] = np.eye(H, dtype=np.float32)
    tensors["token_embd.weight"] = trunk["token_embd.weight"]
    tensors["output_norm.weight"] = np.ones(H, np.float32)
    for name in list(tensors):
        if name.endswith(("attn_output.weight", "ffn_down.weight")):
            tensors[name] = np.zeros_like(tensors[name])
        elif name.endswith("layer_output_scale.weight"):
            tensors[name] = np.ones_like(tensors[name])
    return write(path, ASSISTANT_ARCH, meta, tensors)
