"""Acceptance and speed of the Gemma 4 assistant on a trained-to-agree toy setup.

A random tiny gemma4 target (transformers 5.25) and a random assistant; the assistant is
distilled briefly (Adam, cross-entropy) on the target's own greedy outputs, one draft position
at a time, through transformers' trainable ``Gemma4AssistantForCausalLM`` with the target's
committed K/V. Both are converted to GGUF and run by this plugin. Then, on held-out prompts,
paired runs in alternating order: plain vs plain (the control row) and plain vs ``draft-head``
with the assistant (greedy, pmin 0, draft 3); every pair's outputs are checked equal.
Printed: acceptance before and after distillation and the median per-pair time ratios.
Nothing here is a real-model speed.

    python plugins/model_gemma4/scripts/bench_assistant.py [--steps 300] [--pairs 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import gemma4_tiny as tiny  # noqa: E402
import tsspec  # noqa: E402
from tsspec_model_gemma4.assistant import attach_assistant  # noqa: E402
from tsspec_model_gemma4.loader import load_gemma4  # noqa: E402

PROMPT_LEN, GEN = 8, 24


def sequences(path: str, count: int, seed: int) -> torch.Tensor:
    """[count, PROMPT_LEN + GEN] random prompts and the target's greedy continuations."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        prompt = torch.randint(3, tiny.VOCAB, (PROMPT_LEN,), generator=g).tolist()
        out = tsspec.generate(load_gemma4(path), prompt, tsspec.SpeculationOptions(enabled=False), max_tokens=GEN)
        rows.append(prompt + list(out.tokens)[:GEN])
    return torch.tensor(rows)


def distill(target, assistant, seqs: torch.Tensor, steps: int, log) -> None:
    with torch.no_grad():
        out = target(seqs, use_cache=False, output_hidden_states=True, return_shared_kv_states=True)
    hidden, labels, shared = out.hidden_states[-1], out.logits.argmax(-1), out.shared_kv_states
    embed = target.model.embed_tokens
    opt = torch.optim.Adam(assistant.parameters(), lr=1e-3)
    positions = list(range(PROMPT_LEN, seqs.shape[1] - 1))
    for step in range(steps):
        P = positions[step % len(positions)]
        kv = {k: (v[0][:, :, :P], v[1][:, :, :P]) for k, v in shared.items()}
        with torch.no_grad():
            x = torch.cat([embed(seqs[:, P : P + 1]), hidden[:, P - 1 : P]], dim=-1)
        logits = assistant(inputs_embeds=x, position_ids=torch.full((seqs.shape[0], 1), P), shared_kv_states=kv,
                           use_cache=False).logits[:, 0]
        loss = torch.nn.functional.cross_entropy(logits, labels[:, P])  # the target's token after P
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            log(f"  distill step {step}: loss {loss.item():.3f}")


def timed(make, prompt, options) -> tuple[float, object]:
    target = make()
    start = time.perf_counter()
    result = tsspec.generate(target, prompt, options, max_tokens=GEN)
    return time.perf_counter() - start, result


def measure(path: str, assistant_path: str, prompts, pairs: int):
    plain = tsspec.SpeculationOptions(enabled=False)
    spec = tsspec.SpeculationOptions(spec_type="draft-head", pmin=0.0, adaptive=False, draft=3)

    def with_head():
        t = load_gemma4(path)
        t.draft_head = attach_assistant(t, assistant_path)
        return t

    control, ratio, drafted, accepted = [], [], 0, 0
    for i in range(pairs):
        prompt = prompts[i % len(prompts)]
        order = (0, 1) if i % 2 == 0 else (1, 0)  # alternate which run goes first
        runs = {}
        for which in order:
            runs[("a", which)] = timed(lambda: load_gemma4(path), prompt, plain)
        control.append(runs[("a", 1)][0] / runs[("a", 0)][0])
        runs = {}
        for which in order:
            runs[which] = timed(lambda: load_gemma4(path), prompt, plain) if which == 0 else timed(with_head, prompt, spec)
        assert runs[0][1].tokens == runs[1][1].tokens, "speculative output differs from plain"
        ratio.append(runs[0][0] / runs[1][0])
        drafted += runs[1][1].stats.draft_tokens
        accepted += runs[1][1].stats.accepted_tokens
    return statistics.median(control), statistics.median(ratio), accepted / max(1, drafted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=6)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp())
    target = tiny.hf_target(dtype=torch.float32)
    path = tiny.write_target(target, root / "target.gguf")
    assistant = tiny.hf_assistant(dtype=torch.float32, spread=False)  # HF init; the full head (centroids get no gradient)
    prompts = sequences(path, 4, seed=99)[:, :PROMPT_LEN].tolist()  # held out
    before = tiny.write_assistant(assistant, root / "before.gguf")
    _, _, acc0 = measure(path, before, prompts, 2)
    print(f"random assistant: acceptance {acc0:.2f}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread trains faster
    distill(target, assistant.train(), sequences(path, 32, seed=1), args.steps, print)
    torch.set_num_threads(threads)
    after = tiny.write_assistant(assistant.eval(), root / "after.gguf")
    control, ratio, acc = measure(path, after, prompts, args.pairs)
    print(f"distilled assistant ({args.steps} steps): acceptance {acc:.2f}")
    print(f"plain vs plain (control): median time ratio {control:.2f}x over {args.pairs} pairs")
    print(f"draft-head (assistant) vs plain: median speed-up {ratio:.2f}x over {args.pairs} pairs "
          "(outputs equal in every pair)")


if __name__ == "__main__":
    main()
