"""Where a tsspec draft head's tensors go in a speculators checkpoint, one table per type.

A ``HeadLayout`` names a speculators type, the tsspec head parameters it holds (each with its
Hugging Face name), which of them follow RoPE's pair layout, and the pieces the type's
equations need that a head may lack. Adding a type is adding a table: the exporter and the
reader walk it both ways.

RoPE layout: tsspec heads turn adjacent pairs (llama.cpp's layout, ``(2i, 2i+1)``); Hugging
Face layers turn halves (``(i, i + hd/2)``). Rows of q/k projections and entries of q/k norms
are reordered per head (``to_hf`` / ``from_hf``), which changes no attention score.
"""

from __future__ import annotations

from typing import Callable

import attrs
import numpy as np

__all__ = ["HeadLayout", "MTP", "LAYOUTS", "GGUF_ARCHITECTURES", "to_hf", "from_hf"]

# a verifier's Hugging Face architectures entry -> the GGUF architecture tsspec loads it as
GGUF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}


@attrs.frozen
class HeadLayout:
    kind: str  # speculators_model_type
    architecture: str  # the config's architectures entry
    prefix: str  # the HF name prefix of the head's layer
    tensors: dict[str, str]  # tsspec head parameter -> HF name under ``prefix``
    rope_rows: dict[str, str]  # parameter -> "q" / "k": rows (or entries) grouped by that head count
    # (predicate on the head's config, the missing piece named in the refusal)
    needs: tuple[tuple[Callable[[object], bool], str], ...] = ()
    verifier_owned: tuple[str, ...] = ()  # HF names the format reloads from the verifier

    def missing(self, cfg) -> list[str]:
        """The pieces this type's equations need that a head of ``cfg`` lacks."""
        return [piece for ok, piece in self.needs if not ok(cfg)]


# speculators' mtp: one Qwen3 decoder layer behind input_proj([token_norm(e); hidden_norm(h)]),
# a final norm whose output chains to the next step, and the verifier's full LM head
MTP = HeadLayout(
    kind="mtp",
    architecture="MTPDraftModel",
    prefix="mtp_layers.0.",
    tensors={
        "eh_proj": "input_proj.weight",
        "enorm": "token_layernorm.weight",
        "hnorm": "hidden_layernorm.weight",
        "head_norm": "final_layernorm.weight",
        "attn_norm": "input_layernorm.weight",
        "wq": "self_attn.q_proj.weight",
        "wk": "self_attn.k_proj.weight",
        "wv": "self_attn.v_proj.weight",
        "wo": "self_attn.o_proj.weight",
        "q_norm": "self_attn.q_norm.weight",
        "k_norm": "self_attn.k_norm.weight",
        "ffn_norm": "post_attention_layernorm.weight",
        "w_gate": "mlp.gate_proj.weight",
        "w_up": "mlp.up_proj.weight",
        "w_down": "mlp.down_proj.weight",
    },
    rope_rows={"wq": "q", "wk": "k", "q_norm": "q", "k_norm": "k"},
    needs=(
        (lambda cfg: not getattr(cfg, "feature_layers", ()), "the verifier's last hidden state alone (this head "
                                                              "fuses taps of several layers)"),
        (lambda cfg: cfg.qk_norm, "per-head q/k norms (speculators' mtp layer is a Qwen3 decoder layer)"),
        (lambda cfg: cfg.shared_head, "the verifier's own LM head over its whole vocabulary (speculators' mtp "
                                      "has no draft vocabulary; this head drafts with rows of its own)"),
    ),
    verifier_owned=("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight"),
)

LAYOUTS: dict[str, HeadLayout] = {MTP.kind: MTP}
# why no table maps a tsspec head to eagle3 (named in the export's refusal)
EAGLE3_GAP = ("eagle3 needs attention over the 2H-wide [embedding; hidden] input with the hidden part as the "
              "residual (a NextN head projects to H first)")


def _order(head_dim: int) -> np.ndarray:
    """HF half-layout index j -> the adjacent-pair index it holds: [0, 2, 4, .., 1, 3, 5, ..]."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def to_hf(array: np.ndarray, head_dim: int) -> np.ndarray:
    """Rows [heads * hd, ...] (or a norm [hd]) from adjacent-pair to half layout, per head."""
    grouped = array.reshape(-1, head_dim, *array.shape[1:])  # [heads, hd, ...]
    return np.ascontiguousarray(grouped[:, _order(head_dim)].reshape(array.shape))


def from_hf(array: np.ndarray, head_dim: int) -> np.ndarray:
    """The inverse of ``to_hf``."""
    grouped = array.reshape(-1, head_dim, *array.shape[1:])
    return np.ascontiguousarray(grouped[:, np.argsort(_order(head_dim))].reshape(array.shape))
