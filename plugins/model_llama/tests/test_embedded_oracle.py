"""The embedded default model (SmolLM2-135M-Instruct Q4_1) against transformers loading the same
GGUF file: logits within 1e-3 relative, identical greedy text; verify/rewind on the real model."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.oracle

RELATIVE_TOL = 1e-3
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
    "Translate to French: I would like a cup of coffee, please.",
]
CHAT = [
    "Write a short poem about the ocean.",
    "Rewrite this Python code to use a list comprehension:\nresult = []\nfor x in range(10):\n    if x % 2 == 0:\n        result.append(x * x)",
]


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got - expected).abs().max() / expected.abs().max()).item()


def hf_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def greedy(target, ids: list[int], n: int) -> list[int]:
    """Plain greedy decoding driven directly through spec_forward."""
    target.spec_rewind_cache(0)
    logits, _ = target.spec_forward(ids, all_logits_rows=False, want_hidden=False)
    out = []
    for _ in range(n):
        token = int(logits[-1].argmax())
        out.append(token)
        logits, _ = target.spec_forward([token], all_logits_rows=False, want_hidden=False)
    return out


def test_logits_match_transformers(embedded_target, hf_embedded):
    tok = embedded_target.tokenizer
    for text in PROMPTS + [tok.apply_chat_template([{"role": "user", "content": c}]) for c in CHAT]:
        ids = tok.encode(text)
        embedded_target.spec_rewind_cache(0)
        ours, _ = embedded_target.spec_forward(ids, all_logits_rows=True, want_hidden=False)
        assert relative_error(ours, hf_logits(hf_embedded, ids)) < RELATIVE_TOL, text


def test_greedy_generation_matches_transformers(embedded_target, hf_embedded):
    tok = embedded_target.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": c}]) for c in CHAT]
    for text in texts:
        ids = tok.encode(text)
        ours = greedy(embedded_target, ids, 64)
        with torch.no_grad():
            out = hf_embedded.generate(
                torch.tensor([ids]), max_new_tokens=64, do_sample=False, attention_mask=torch.ones(1, len(ids), dtype=torch.long)
            )
        theirs = out[0, len(ids):].tolist()
        # transformers stops at its eos (<|im_end|>); up to there the texts must be identical
        assert ours[: len(theirs)] == theirs, (tok.decode(ours), tok.decode(theirs))
        assert len(theirs) == 64 or theirs[-1] in tok.eos_token_ids
        assert len(theirs) >= 16


def test_generate_api_plain_run_is_the_greedy_loop(embedded_target):
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions

    ids = embedded_target.tokenizer.encode(PROMPTS[2])
    expected = greedy(embedded_target, ids, 24)
    embedded_target.spec_rewind_cache(0)
    result = generate(embedded_target, ids, SpeculationOptions(enabled=False), max_tokens=24)
    n = len(result.tokens)
    assert result.tokens == expected[:n] and (n == 24 or expected[n - 1] in embedded_target.tokenizer.eos_token_ids)


def test_verify_rows_equal_one_row_decode_and_rewind(embedded_target):
    tok = embedded_target.tokenizer
    ids = tok.encode(PROMPTS[1])
    draft = greedy(embedded_target, ids, 8)
    embedded_target.spec_rewind_cache(0)
    embedded_target.spec_forward(ids, all_logits_rows=False, want_hidden=False)
    start = embedded_target.cache_seq_len
    singles = [embedded_target.spec_forward([t], all_logits_rows=False, want_hidden=True) for t in draft]
    embedded_target.spec_rewind_cache(start)
    rows, hidden = embedded_target.spec_forward(draft, all_logits_rows=True, want_hidden=True)
    scale = rows.abs().max().item()
    for k, (logits, h) in enumerate(singles):
        assert (rows[k] - logits[0]).abs().max().item() <= 1e-4 * scale
        assert (hidden[k] - h[0]).abs().max().item() <= 1e-4 * max(1.0, h.abs().max().item())
    # a rejected tail is undone by a rewind: re-forwarding gives the very same numbers
    embedded_target.spec_rewind_cache(start + 3)
    again, _ = embedded_target.spec_forward(draft[3:], all_logits_rows=True, want_hidden=False)
    embedded_target.spec_rewind_cache(start + 3)
    once_more, _ = embedded_target.spec_forward(draft[3:], all_logits_rows=True, want_hidden=False)
    assert torch.equal(again, once_more)
    assert (again - rows[3:]).abs().max().item() <= 1e-4 * scale


def test_warm_load_uses_the_cache(embedded_path, embedded_target):
    from tsspec_model_llama import load_llama

    again = load_llama(embedded_path)
    assert again.cache_hit is True
    ids = again.tokenizer.encode(PROMPTS[0])
    embedded_target.spec_rewind_cache(0)
    a, _ = embedded_target.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    b, _ = again.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    assert torch.equal(a, b)
    assert again.config.num_layers == 30 and again.config.hidden_size == 576
    assert again.config.extra["num_kv_heads"] == 3 and again.config.vocab_size == 49152
