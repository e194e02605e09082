"""Shared fixtures: a tiny float64 HF target + DFlash assistant pair (the oracle), slow
references written from the published equations, and a target view over HF modules.

The HF assistant is made exactly float64: transformers computes RoPE angles, RMSNorm and eager
softmax in float32 whatever the model dtype, so the test swaps those three for float64 versions
of the same formulas (sdpa attention runs in the model dtype). Weights are rounded to float32
values so that the float32 GGUF the converter writes holds them exactly.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from tsspec.protocols import ModelConfig

transformers = pytest.importorskip("transformers")

EPS = 2.0**-20  # exactly representable in the float32 GGUF key


class HFTargetView:
    """The drafter-facing surface of a SpeculativeTarget over an HF causal LM (oracle tests)."""

    def __init__(self, model):
        self.model = model
        cfg = model.config
        self.config = ModelConfig("hf-oracle", cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, 256)
        self.draft_head = None
        self.taps = None

    def embed(self, ids):
        return self.model.model.embed_tokens(torch.as_tensor(list(ids), dtype=torch.long))

    def lm_head(self, h):
        return self.model.lm_head(h.to(torch.float64))

    def spec_set_feature_taps(self, layers):
        self.taps = list(layers) if layers else None

    @property
    def spec_feature_size(self):
        return (len(self.taps) if self.taps else 1) * self.config.hidden_size

    def features(self, ids):
        """Rows [T, taps*H]: the residual ENTERING each tapped layer (HF hidden_states[tap])."""
        with torch.no_grad():
            out = self.model(torch.as_tensor([list(ids)]), output_hidden_states=True)
        return torch.cat([out.hidden_states[t][0] for t in self.taps], dim=-1)


def _float64_exact(assistant, head_dim: int, base: float):
    def rotary(self, x, position_ids):
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        freqs = position_ids[..., None].double() * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    assistant.rotary_emb.forward = types.MethodType(rotary, assistant.rotary_emb)
    for module in assistant.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(norm, module)


def build_pair(*, seed=0, vocab=61, hidden=32, target_layers=4, hf_ids=(0, 2), window=64, block=5,
               n_layers=2, n_head=4, n_kv=2, head_dim=8):
    """(HF llama target, HF muse_glimmer_assistant drafter), both float64, random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    torch.manual_seed(seed)
    tcfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=48, num_hidden_layers=target_layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       tie_word_embeddings=False)
    target = LlamaForCausalLM(tcfg).double().eval()
    acfg = MuseGlimmerAssistantConfig(
        hidden_size=hidden, intermediate_size=40, num_hidden_layers=n_layers, num_attention_heads=n_head,
        num_key_value_heads=n_kv, head_dim=head_dim, rms_norm_eps=EPS,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=256,
        sliding_window=window, block_size=block, mask_token_id=vocab - 1, target_layer_ids=list(hf_ids),
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    acfg._attn_implementation = "sdpa"
    assistant = MuseGlimmerAssistantModel(acfg).double().eval()
    with torch.no_grad():
        for name, p in assistant.named_parameters():
            if "norm" in name:
                p.copy_((1 + 0.3 * torch.randn_like(p)).float().double())
            else:
                p.copy_((0.3 * torch.randn_like(p)).float().double())
    _float64_exact(assistant, head_dim, 10000.0)
    return target, assistant


def hf_block_hidden(assistant, view, cache, features, context, position, anchor):
    """The assistant's final hidden rows [B, H] for a block at ``position`` given the NEW context
    rows ``features[context[0]:context[1]]`` (the DFlashTokenCandidateGenerator call sequence)."""
    cfg = assistant.config
    ctx = features[context[0] : context[1]][None]
    cache.set_previous_accepted_tokens(ctx.shape[1])
    noise = view.embed([anchor] + [cfg.mask_token_id] * (cfg.block_size - 1))[None]
    position_ids = torch.arange(context[0], position + cfg.block_size)[None]
    mask = torch.ones(1, position + cfg.block_size, dtype=torch.long)
    with torch.no_grad():
        out = assistant(noise_embeds=noise, context_hidden_states=ctx, position_ids=position_ids,
                        attention_mask=mask, cache=cache)
    return out.last_hidden_state[0]


def slow_conv(x, coef, base, group_size):
    """out[r][c] = sum_{t<K, t<=r} (base[t][c] + coef[r][t][c // gs]) * x[r-t][c], by loops."""
    rows, width = x.shape
    kernel = base.shape[0]
    out = torch.zeros_like(x)
    for r in range(rows):
        for c in range(width):
            total = 0.0
            for t in range(kernel):
                if t <= r:
                    total += (float(base[t, c]) + float(coef[r, t, c // group_size])) * float(x[r - t, c])
            out[r, c] = total
    return out


def slow_select(logits, hidden, anchor, w_hidden, pred, succ, top_k):
    """The selector's greedy walk written from the equations, one candidate at a time."""
    tokens, confs = [], []
    prev = int(anchor)
    for e in range(logits.shape[0]):
        row = logits[e].tolist()
        order = sorted(range(len(row)), key=lambda c: (-row[c], c))[:top_k]
        p = [sum(float(w_hidden[r, j]) * float(hidden[e, j]) for j in range(hidden.shape[1]))
             for r in range(w_hidden.shape[0])]
        scores = []
        for c in order:
            pair = sum(float(pred[prev, r]) * p[r] * float(succ[c, r]) for r in range(len(p)))
            scores.append(row[c] + pair)
        best = max(range(len(scores)), key=lambda j: (scores[j], -j))
        top = max(scores)
        total = sum(math.exp(s - top) for s in scores)
        tokens.append(order[best])
        confs.append(math.exp(scores[best] - top) / total)
        prev = order[best]
    return tokens, confs


def write_drafter(path, *, arch="dflash", prefix=None, drop=(), extra=None, drop_tensors=(), seed=0,
                  mask_key="tokenizer.ggml.mask_token_id", selector_vocab=None, **meta_args):
    """A random drafter GGUF with control over its spelling: the architecture, the key prefix
    (``dflash-draft.dflash.`` variants), keys or tensors left out, extra keys."""
    from tsspec_gguf.gguf_writer import write_gguf

    from tsspec_block.random_drafter import random_dflash_metadata, random_dflash_tensors

    meta = random_dflash_metadata(**meta_args)
    tensors = random_dflash_tensors(meta, selector_vocab=selector_vocab or meta_args.get("vocab_size"), seed=seed)
    prefix = f"{arch}." if prefix is None else prefix
    metadata = {mask_key: meta.pop("__mask_token_id__")}
    metadata.update({prefix + k: v for k, v in meta.items() if k not in drop})
    metadata.update(extra or {})
    for name in drop_tensors:
        tensors.pop(name)
    write_gguf(path, arch, metadata, tensors)
    return path


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny matrices: a second torch thread only spins (40x slower on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def drafter_file():
    return write_drafter


@pytest.fixture(scope="session")
def oracle_pair():
    return build_pair


@pytest.fixture(scope="session")
def hf_view():
    return HFTargetView


@pytest.fixture(scope="session")
def hf_block():
    return hf_block_hidden


@pytest.fixture(scope="session")
def slow_refs():
    return types.SimpleNamespace(conv=slow_conv, select=slow_select)
