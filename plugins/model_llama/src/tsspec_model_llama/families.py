"""The dense transformer families this plugin serves, each a row of typed capability fields.

A family is llama's block with some of these differences (llama.cpp's ``src/models/*.cpp``):
RoPE on NEOX pairs (i, i + rope_dim / 2) instead of adjacent ones, RMSNorm per head on Q and K,
Gemma's extras (embedding scaled by sqrt(hidden), a norm after the attention output and after
the feed-forward, GELU-tanh), soft-capped attention scores and logits, sliding-window layers in
a fixed pattern with their own RoPE base, Q/K/V or gate/up stored as one fused tensor, and the
turn format chat falls back to when a file has no chat template.
Attention biases and tied embeddings are read from whichever tensors the file has. Adding a
family is one ``Family`` row here; the loader and target read only the fields.
"""

from __future__ import annotations

import attrs

from .chat_templates import BUILTIN

ACTIVATIONS = ("silu", "gelu_tanh")


@attrs.frozen
class Family:
    architecture: str
    rope_neox: bool = False  # rotate pairs (i, i + rope_dim/2): Q/K rows are permuted at load
    qk_norm: bool = False  # attn_q_norm / attn_k_norm: RMSNorm over each head's dims
    post_norms: bool = False  # post_attention_norm / post_ffw_norm before each residual add
    embedding_scale: bool = False  # the embedding rows times sqrt(hidden)
    activation: str = attrs.field(default="silu", validator=attrs.validators.in_(ACTIVATIONS))
    fused_qkv: bool = False  # attn_qkv [q + 2 kv, H] instead of attn_q, attn_k, attn_v
    fused_gate_up: bool = False  # ffn_up [2 F, H] = [gate; up], no ffn_gate
    swa_period: int = 0  # 0: no sliding layers; else layer i slides iff i % period < period - 1
    soft_capping: bool = False  # reads {arch}.attn_logit_softcapping / final_logit_softcapping
    local_rope_base: float | None = None  # RoPE base of sliding layers when the file names none
    hf_norm_offset: float = 0.0  # what HF -> GGUF conversion adds to every norm weight (Gemma: 1)
    # block counts of the variants whose attention scale is 1/sqrt(hidden / heads) rather than
    # 1/sqrt(head_dim) when the file names none (Gemma's 27B models, as llama.cpp decides)
    scale_by_hidden_at_layers: tuple[int, ...] = ()
    # the turn format (a key of chat_templates.BUILTIN) chat uses when the file carries no
    # tokenizer.chat_template, as llama.cpp falls back to a built-in template by family
    builtin_chat_template: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(tuple(BUILTIN))))

    @property
    def llama_block(self) -> bool:
        """True when a block is llama's (after the load-time permutation of NEOX rows): the
        compiled fused layer stack runs it."""
        return not (self.qk_norm or self.post_norms or self.embedding_scale or self.activation != "silu"
                    or self.swa_period or self.soft_capping)


FAMILIES: dict[str, Family] = {
    f.architecture: f
    for f in (
        Family("llama"),
        Family("qwen2", rope_neox=True),
        Family("qwen3", rope_neox=True, qk_norm=True),
        Family("phi3", rope_neox=True, fused_qkv=True, fused_gate_up=True),
        Family("gemma2", rope_neox=True, post_norms=True, embedding_scale=True, activation="gelu_tanh",
               swa_period=2, soft_capping=True, hf_norm_offset=1.0, scale_by_hidden_at_layers=(46,),
               builtin_chat_template="gemma"),
        Family("gemma3", rope_neox=True, qk_norm=True, post_norms=True, embedding_scale=True,
               activation="gelu_tanh", swa_period=6, local_rope_base=10000.0, hf_norm_offset=1.0,
               scale_by_hidden_at_layers=(62,), builtin_chat_template="gemma"),
    )
}


def family_of(architecture: str) -> Family | None:
    return FAMILIES.get(architecture)
