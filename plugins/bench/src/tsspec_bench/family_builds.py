"""The families' trained-to-agree setups for ``tsspec bench --families``: tiny random targets from a
seed (transformers), converted and loaded through the registered plugins, and their drafters
distilled briefly on the targets' own greedy outputs.

Only public routes reach the model plugins: ``convert_as`` (the registered converters),
``load_model`` (the registered loaders and drafter attaches) and the target's ``spec_forward``.
Each builder returns (the target with its draft head attached, a sentence on what was built).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import torch

PROMPT_LEN = 8
TRAIN_TOKENS = 24

GEMMA4_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                "sliding_attention", "full_attention"]
GEMMA4_TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=len(GEMMA4_TYPES),
                   num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64, sliding_window=4,
                   layer_types=GEMMA4_TYPES, hidden_size_per_layer_input=32, vocab_size_per_layer_input=128,
                   num_kv_shared_layers=2, final_logit_softcapping=5.0, use_double_wide_mlp=True,
                   attention_k_eq_v=True, num_global_key_value_heads=1, max_position_embeddings=256,
                   rms_norm_eps=1e-6)
GEMMA4_ASSISTANT_TEXT = dict(model_type="gemma4_text", vocab_size=128, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                             global_head_dim=64, sliding_window=3, layer_types=["sliding_attention", "full_attention"],
                             hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, attention_k_eq_v=True,
                             num_global_key_value_heads=1, max_position_embeddings=256)
GLM_DSA = dict(vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8,
               qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
               n_group=1, topk_group=1, routed_scaling_factor=1.5, first_k_dense_replace=1, index_n_heads=8,
               index_head_dim=16, index_topk=16, max_position_embeddings=512,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, num_nextn_predict_layers=1,
               tie_word_embeddings=False)


def _eager(config) -> None:
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"


def _convert(catalog, model_type: str, config: dict, state: dict, root: Path, name: str) -> str:
    """Write an HF checkpoint (config.json, safetensors) and convert it with the registered converter."""
    from safetensors.torch import save_file

    from tsspec.runtime.converting import convert_as

    src = root / name
    src.mkdir(exist_ok=True)
    (src / "config.json").write_text(json.dumps(config, default=str))
    save_file({k: v.detach().float().contiguous().clone() for k, v in state.items()}, str(src / "model.safetensors"))
    out = root / f"{name}.gguf"
    convert_as(model_type, src, out, catalog=catalog)
    return str(out)


def _load(catalog, path: str, draft_head: bool, draft_model: str | None = None):
    from tsspec import SpeculationOptions
    from tsspec.runtime.loading import load_model

    options = SpeculationOptions(spec_type="draft-head") if draft_head else SpeculationOptions(enabled=False)
    return load_model(path, options=options, draft_model=draft_model, catalog=catalog)


def train_prompts(vocab: int, size) -> list[list[int]]:
    """The prompts whose greedy continuations the drafter is distilled on."""
    g = torch.Generator().manual_seed(size.seed + 1)
    return [torch.randint(3, vocab, (PROMPT_LEN,), generator=g).tolist() for _ in range(size.train_sequences)]


def _greedy(target, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """The target's greedy continuation of ``prompt`` ([PROMPT_LEN + n] ids) and the trunk rows
    of every position ([PROMPT_LEN + n, F]), through the target's own ``spec_forward``."""
    target.spec_rewind_cache(0)
    logits, hidden = target.spec_forward(prompt, all_logits_rows=False, want_hidden=True)
    tokens, rows = list(prompt), [hidden]
    for _ in range(n):
        tokens.append(int(logits[-1].argmax()))
        target.spec_keep(len(rows[-1]))
        logits, hidden = target.spec_forward([tokens[-1]], all_logits_rows=False, want_hidden=True)
        rows.append(hidden)
    target.spec_keep(1)
    target.spec_rewind_cache(0)
    return tokens, torch.cat(rows)[: len(tokens)]


def _loss_text(losses: list[float]) -> str:
    k = max(1, min(10, len(losses) // 3))
    return f"loss {statistics.mean(losses[:k]):.2f} -> {statistics.mean(losses[-k:]):.2f}"


def _one_thread():
    """Tiny matrices train fastest on one torch thread; returns the count to restore."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return threads


# ----------------------------------------------------------------------------- Gemma 4

def _gemma4_init(model, seed: int) -> None:
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


def build_gemma4(catalog, size, root: Path, say):
    """A 7-layer gemma4 target (sliding and full layers, KV sharing, per-layer inputs) and a 2-layer
    assistant distilled on the target's greedy continuations, one draft position per step, through
    transformers' trainable assistant reading the target's committed K/V."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    from transformers.models.gemma4_assistant import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    torch.manual_seed(size.seed)
    config = Gemma4TextConfig(**GEMMA4_TEXT)
    _eager(config)
    hf_target = Gemma4ForCausalLM(config).eval()
    _gemma4_init(hf_target, size.seed)
    target_path = _convert(catalog, "gemma4_text", config.to_dict(), hf_target.state_dict(), root, "target")
    plain = _load(catalog, target_path, False)
    seqs = torch.tensor([_greedy(plain, p, TRAIN_TOKENS)[0]
                         for p in train_prompts(config.vocab_size, size)])
    aconfig = Gemma4AssistantConfig(text_config=GEMMA4_ASSISTANT_TEXT, backbone_hidden_size=config.hidden_size,
                                    use_ordered_embeddings=False)
    _eager(aconfig)
    _eager(aconfig.text_config)
    torch.manual_seed(size.seed + 2)
    assistant = Gemma4AssistantForCausalLM(aconfig).train()
    threads, start = _one_thread(), time.perf_counter()
    try:
        losses = _distil_gemma4(hf_target, assistant, seqs, size.distill_steps)
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - start
    say(f"gemma4: assistant distilled, {_loss_text(losses)}")
    assistant_path = _convert(catalog, "gemma4_assistant", aconfig.to_dict(), assistant.eval().state_dict(), root,
                              "assistant")
    target = _load(catalog, target_path, True, draft_model=assistant_path)
    setup = (f"gemma4 target: {config.num_hidden_layers} layers (sliding and full attention, "
             f"{config.num_kv_shared_layers} KV-shared, per-layer inputs), width {config.hidden_size}, vocab "
             f"{config.vocab_size}, seed {size.seed}; a random {aconfig.text_config.num_hidden_layers}-layer assistant "
             f"distilled {size.distill_steps} steps on {size.train_sequences} greedy continuations in {seconds:.1f} s, "
             f"{_loss_text(losses)}")
    return target, setup


def _distil_gemma4(hf_target, assistant, seqs: torch.Tensor, steps: int) -> list[float]:
    """Cross-entropy of the assistant's first draft against the target's next token, one
    position P of every sequence per step, with the target's K/V of rows < P."""
    with torch.no_grad():
        out = hf_target(seqs, use_cache=False, output_hidden_states=True, return_shared_kv_states=True)
        hidden, labels, shared = out.hidden_states[-1], out.logits.argmax(-1), out.shared_kv_states
        embedded = hf_target.model.embed_tokens(seqs)
    opt = torch.optim.Adam(assistant.parameters(), lr=1e-3)
    positions = list(range(PROMPT_LEN, seqs.shape[1] - 1))
    losses = []
    for step in range(steps):
        P = positions[step % len(positions)]
        kv = {k: (v[0][:, :, :P], v[1][:, :, :P]) for k, v in shared.items()}
        x = torch.cat([embedded[:, P : P + 1], hidden[:, P - 1 : P]], dim=-1)  # [B, 1, 2H]
        logits = assistant(inputs_embeds=x, position_ids=torch.full((seqs.shape[0], 1), P), shared_kv_states=kv,
                           use_cache=False).logits[:, 0]
        loss = torch.nn.functional.cross_entropy(logits, labels[:, P])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


# ----------------------------------------------------------------------------- GLM 5.x (glm-dsa)

class _NextN(torch.nn.Module):
    """The NextN block in transformers' parts: e = enorm(embed(token)), h = hnorm(trunk row),
    one decoder layer over eh_proj([e; h]), then shared_head.norm; the target's head scores it."""

    def __init__(self, config):
        from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as m

        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        layer_config = type(config)(**{**GLM_DSA, "num_hidden_layers": 1, "first_k_dense_replace": 0,
                                        "index_topk": GLM_DSA["max_position_embeddings"]})  # dense, as NextN runs
        _eager(layer_config)
        self.enorm, self.hnorm, self.head_norm = (m.GlmMoeDsaRMSNorm(H, eps) for _ in range(3))
        self.eh_proj = torch.nn.Linear(2 * H, H, bias=False)
        self.layer = m.GlmMoeDsaDecoderLayer(layer_config, 0)
        self.rotary = m.GlmMoeDsaRotaryEmbedding(layer_config)

    def forward(self, e: torch.Tensor, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        u = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h)], -1))  # [B, S, H]
        S = u.shape[1]
        mask = torch.full((S, S), torch.finfo(u.dtype).min).triu(1)[None, None].expand(u.shape[0], 1, S, S)
        out, _ = self.layer(u, attention_mask=mask, position_ids=positions,
                            position_embeddings=self.rotary(u, positions))
        return self.head_norm(out)

    def checkpoint_tensors(self, layer: int) -> dict[str, torch.Tensor]:
        """The block's tensors under the HF checkpoint names ``model.layers.{layer}.*``."""
        out = {f"model.layers.{layer}.{k}": v for k, v in self.layer.state_dict().items()}
        out[f"model.layers.{layer}.eh_proj.weight"] = self.eh_proj.weight
        for name, norm in (("enorm", self.enorm), ("hnorm", self.hnorm), ("shared_head.norm", self.head_norm)):
            out[f"model.layers.{layer}.{name}.weight"] = norm.weight
        return out


def _glm_init(model, seed: int) -> None:
    """Sharper than the HF init: the random model has habits worth predicting."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                scale = 2.0 if ("embed" in name or "lm_head" in name) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * scale / math.sqrt(p.shape[-1]))


def build_glm_dsa(catalog, size, root: Path, say):
    """A 3-layer glm-dsa target (MLA, DSA indexer with top-k below the context, MoE) with one NextN
    layer, distilled on the target's greedy continuations and its own trunk rows."""
    import transformers as t

    torch.manual_seed(size.seed)
    config = t.GlmMoeDsaConfig(**GLM_DSA)
    _eager(config)
    hf_target = t.GlmMoeDsaForCausalLM(config).eval()
    _glm_init(hf_target, size.seed)
    nextn = _NextN(config)
    _glm_init(nextn, size.seed + 2)
    trunk_state = {k: v for k, v in hf_target.state_dict().items()}
    L = config.num_hidden_layers

    def convert(name: str) -> str:
        return _convert(catalog, "glm_moe_dsa", config.to_dict(), {**trunk_state, **nextn.checkpoint_tensors(L)},
                        root, name)

    plain = _load(catalog, convert("untrained"), False)
    data = [_greedy(plain, p, TRAIN_TOKENS) for p in train_prompts(config.vocab_size, size)]
    embed, head = hf_target.model.embed_tokens.weight.detach(), hf_target.lm_head.weight.detach()
    threads, start = _one_thread(), time.perf_counter()
    try:
        losses = _distil_nextn(nextn, data, embed, head, size.distill_steps)
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - start
    say(f"glm-dsa: NextN distilled, {_loss_text(losses)}")
    target = _load(catalog, convert("distilled"), True)
    setup = (f"glm-dsa target: {L} layers ({config.first_k_dense_replace} dense, MoE {config.n_routed_experts} "
             f"experts), MLA, DSA index_topk {config.index_topk}, width {config.hidden_size}, vocab {config.vocab_size}, "
             f"seed {size.seed}; a random NextN layer distilled {size.distill_steps} steps on {size.train_sequences} "
             f"greedy continuations in {seconds:.1f} s, {_loss_text(losses)}")
    return target, setup


def _distil_nextn(nextn: _NextN, data, embed: torch.Tensor, head: torch.Tensor, steps: int,
                  batch: int = 8) -> list[float]:
    """Cross-entropy of the NextN prediction at positions 1 .. n-1 (token p and the trunk row of
    p - 1) against the target's token p + 1; ``batch`` sequences a step."""
    tokens = torch.tensor([d[0] for d in data])  # [N, n + 1]
    rows = torch.stack([d[1] for d in data]).float()  # [N, n + 1, H]
    n = tokens.shape[1] - 1
    positions = torch.arange(1, n)[None]
    opt = torch.optim.Adam([p for p in nextn.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    nextn.train()
    for step in range(steps):
        pick = [(step * batch + i) % len(data) for i in range(batch)]
        e, h = embed[tokens[pick, 1:n]], rows[pick, : n - 1]
        logits = torch.nn.functional.linear(nextn(e, h, positions), head)  # [B, n - 1, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[pick, 2 : n + 1].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    nextn.eval()
    return losses
