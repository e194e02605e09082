"""The NextN head on a trained-to-agree setup: a tiny random GLM 5.x (converted through the plugin's
converter), its NextN layer distilled briefly on the target's own greedy continuations, then
greedy generation plain vs ``draft-head`` vs ``ngram`` on held-out prompts: acceptance, tokens
per verify, and milliseconds per token in paired, alternating runs with a plain-vs-plain control.

Nothing here is a real-model speed: the model is random and tiny (every figure is about the
mechanics). Prints one line per configuration.

    .venv/bin/python plugins/model_glm_dsa/scripts/bench_nextn.py [--steps 150] [--reps 3]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F

CONFIG = dict(
    vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8,
    qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
    n_group=1, topk_group=1, routed_scaling_factor=1.5, first_k_dense_replace=1, index_n_heads=8,
    index_head_dim=16, index_topk=16, max_position_embeddings=512,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, num_nextn_predict_layers=1,
    tie_word_embeddings=False,
)


def build(seed: int):
    """(target with its NextN head, float32) from a random transformers model and a random NextN layer."""
    import transformers as t
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as m

    from tsspec_gguf.gguf_file import MemorySource
    from tsspec_model_glm_dsa.convert import convert_state_dict
    from tsspec_model_glm_dsa.loader import load_from_source
    from tsspec_model_glm_dsa.request import NextNRequest

    torch.manual_seed(seed)
    config = t.GlmMoeDsaConfig(**CONFIG)
    model = t.GlmMoeDsaForCausalLM(config)
    with torch.no_grad():  # sharper than the init: the model has habits worth predicting
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape) * (2.0 if "embed" in name or "lm_head" in name else 1.0) / math.sqrt(p.shape[-1]))
    layer = m.GlmMoeDsaDecoderLayer(t.GlmMoeDsaConfig(**{**CONFIG, "num_hidden_layers": 1, "first_k_dense_replace": 0}), 0)
    H, L = config.hidden_size, config.num_hidden_layers
    sd = dict(model.state_dict())
    for key, value in layer.state_dict().items():
        sd[f"model.layers.{L}.{key}"] = torch.randn(value.shape) / math.sqrt(value.shape[-1]) if value.dim() >= 2 else torch.ones(value.shape)
    sd[f"model.layers.{L}.eh_proj.weight"] = torch.randn(H, 2 * H) / math.sqrt(2 * H)
    for key in ("enorm", "hnorm", "shared_head.norm"):
        sd[f"model.layers.{L}.{key}.weight"] = torch.ones(H)
    arch, meta, tensors = convert_state_dict(config, sd)
    return load_from_source(MemorySource(arch, meta, tensors), request=NextNRequest(True, ""))


def greedy_with_rows(target, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """The target's greedy continuation and the trunk rows of every position."""
    target.spec_rewind_cache(0)
    logits, hidden = target.spec_forward(prompt, all_logits_rows=False, want_hidden=True)
    tokens, rows = list(prompt), [hidden]
    for _ in range(n):
        tokens.append(int(logits[-1].argmax()))
        logits, hidden = target.spec_forward([tokens[-1]], all_logits_rows=False, want_hidden=True)
        rows.append(hidden)
    target.spec_rewind_cache(0)
    return tokens, torch.cat(rows)[: len(tokens)]


def distill(target, prompts: list[list[int]], steps: int, lr: float) -> list[float]:
    """Train the NextN layer's tensors to predict the target's greedy token two ahead."""
    head = target.draft_head
    data = [greedy_with_rows(target, p, 40) for p in prompts]
    params = [t for t in _tensors(head.w) if t.is_floating_point()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=lr)
    losses = []
    for step in range(steps):
        tokens, rows = data[step % len(data)]
        n = len(tokens) - 1
        ids = torch.tensor(tokens[1:n])  # token at position p = 1..n-1
        h_prev = rows[: n - 1]  # the row of position p-1
        labels = torch.tensor(tokens[2 : n + 1])  # the token at p+1
        cache = target.trunk.new_layer_cache(head.w.layer)
        cache.ensure(n + 1)
        w, hp = head.w, target.hp
        from tsspec_model_glm_dsa.ops import rms_norm

        e = rms_norm(head.embed[ids], w.enorm, hp.rms_eps)
        u = F.linear(torch.cat([e, rms_norm(h_prev, w.hnorm, hp.rms_eps)], -1), w.eh_proj)
        out, _ = target.trunk.layer(w.layer, u, cache, 1, first=1)
        logits = F.linear(rms_norm(out, w.head_norm, hp.rms_eps), head.head)
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    for p in params:
        p.requires_grad_(False)
    return losses


def _tensors(obj):
    import attrs

    for field in attrs.fields(type(obj)):
        value = getattr(obj, field.name)
        if isinstance(value, torch.Tensor):
            yield value
        elif attrs.has(type(value)):
            yield from _tensors(value)


def measure(target, configs, prompts, args, generate, SamplingParams) -> None:
    """Greedy generation per configuration, the order alternating by repetition; one line each."""
    ms = {k: [] for k in configs}
    acc = {k: [0, 0, 0] for k in configs}  # accepted, drafted, verify steps
    outputs = {}
    for rep in range(args.reps):
        order = list(configs) if rep % 2 == 0 else list(configs)[::-1]
        for prompt in prompts:
            for name in order:
                out = generate(target, prompt, configs[name], max_tokens=args.tokens, sampling=SamplingParams())
                outputs.setdefault((name, tuple(prompt)), out.tokens)
                s = out.stats
                ms[name].append(s.decode_ms / max(s.emitted_tokens, 1))
                acc[name][0] += s.accepted_tokens
                acc[name][1] += s.draft_tokens
                acc[name][2] += s.verify_steps
    same = all(outputs[(n, tuple(p))] == outputs[("plain A", tuple(p))] for n in configs for p in prompts)
    print(f"outputs equal plain for every configuration and prompt: {same}")
    base = statistics.median(ms["plain A"])
    for name in configs:
        a, d, v = acc[name]
        rate = f"{a / d:.2f}" if d else "-"
        per_verify = f"{(a + v) / v:.2f}" if v else "-"
        print(f"{name:11s} ms/token median {statistics.median(ms[name]):6.2f}  x{base / statistics.median(ms[name]):.2f} "
              f"vs plain A  acceptance {rate}  tokens/verify {per_verify}")


def main() -> None:
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.sampling import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--train-prompts", type=int, default=48)
    ap.add_argument("--draft", type=int, default=3, help="the draft window (--spec-draft)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = build(0)
    g = torch.Generator().manual_seed(1)
    vocab = CONFIG["vocab_size"]
    train = [torch.randint(0, vocab, (8,), generator=g).tolist() for _ in range(args.train_prompts)]
    held = [torch.randint(0, vocab, (8,), generator=g).tolist() for _ in range(4)]
    t0 = time.perf_counter()
    losses = distill(target, train, args.steps, 3e-3)
    print(f"distilled the NextN layer: {args.steps} steps in {time.perf_counter() - t0:.1f} s, "
          f"loss {statistics.mean(losses[:10]):.2f} -> {statistics.mean(losses[-10:]):.2f}")
    configs = {"plain A": SpeculationOptions(enabled=False), "plain B": SpeculationOptions(enabled=False),
               "draft-head": SpeculationOptions(spec_type="draft-head", draft=args.draft, pmin=0.0, adaptive=False),
               "ngram": SpeculationOptions(spec_type="ngram", draft=args.draft, adaptive=False)}
    for label, prompts in (("distillation prompts (the head saw these continuations)", train[:4]),
                           ("held-out prompts", held)):
        print(f"-- {label}")
        measure(target, configs, prompts, args, generate, SamplingParams)
    print(f"load average {os.getloadavg()[0]:.1f}; a tiny random model: mechanics only, not a real-model speed")


if __name__ == "__main__":
    main()
