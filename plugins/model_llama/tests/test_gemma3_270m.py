"""The real Gemma 3 270M Q4_K_M file (the ``gemma3-270m`` named model, installed by ``make
setup``): lossless ngram speculation, logits against transformers loading the same GGUF, and
tokenizer parity with transformers' tokenizer built from it. transformers' load takes 1-3
minutes (262k-entry vocabulary), done once for this module."""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory):
    from tsspec_model_llama.named import NAMED_MODELS

    return NAMED_MODELS["gemma3-270m"].resolve(tmp_path_factory.mktemp("named"))


@pytest.fixture(scope="module")
def gemma(gemma_path):
    from tsspec_model_llama import load_llama

    return load_llama(gemma_path)


@pytest.fixture(scope="module")
def hf_gemma(gemma_path):
    """transformers' model and tokenizer, both from the GGUF (its dequantiser, its converter)."""
    import os

    import transformers

    import gguf

    folder, name = os.path.split(gemma_path)
    readers = {}
    original = gguf.GGUFReader

    def one_reader(path, *args, **kwargs):  # transformers parses the file for the config, the
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))  # weights and the tokenizer:
        if key not in readers:  # once is enough (the reader is read-only)
            readers[key] = original(path, *args, **kwargs)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", one_reader)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model, tokenizer


def test_loads_with_every_matrix_in_blocks(gemma):
    assert gemma.config.architecture == "gemma3"
    served = gemma.served_formats
    assert served["Q5_0"][0] > 0 and all(dense == 0 for kind, (_, dense) in served.items() if kind != "F32")
    assert sum(dense for _, dense in served.values()) == 0  # no dense fallback at all
    assert "Q5_0 x" in gemma.config.extra["weight_formats"]
    assert gemma.hparams.sliding_window == 512 and gemma.hparams.rope_base_local == 10000.0


PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "# the same function, written again:\ndef fibonacci(n):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]


@pytest.mark.parametrize("prompt, sampled", [(PROMPTS[0], False), (PROMPTS[1], True)], ids=["greedy-code", "seeded-prose"])
def test_ngram_speculation_is_lossless(gemma_path, prompt, sampled):
    from tsspec import SpeculationOptions
    from tsspec.runtime.sampling import SamplingParams
    from tsspec.testing import assert_lossless
    from tsspec_model_llama import load_llama
    from tsspec_ngram.speculator import make_ngram

    sampling = SamplingParams(temperature=0.7, top_k=40, seed=5) if sampled else None
    options = SpeculationOptions(adaptive=False)
    ids = load_llama(gemma_path).tokenizer.encode(prompt)
    plain, spec = assert_lossless(lambda: load_llama(gemma_path), lambda t: make_ngram(t, options), ids,
                                  max_tokens=40, sampling=sampling, options=options)
    assert len(plain.tokens) == 40 and spec.stats.accepted_tokens > 0  # drafts were verified and kept


def test_logits_match_transformers(gemma, hf_gemma):
    """Prefill over 530 tokens (the sliding layers' 512-key window crossed), then cached decode
    and a verify of the last rows, against transformers' full forward."""
    model, tokenizer = hf_gemma
    text = " ".join(f"item {i} costs {i * 7 % 97} coins;" for i in range(120))
    ids = tokenizer(text)["input_ids"][:530]
    assert len(ids) == 530
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].float()  # [530, vocab]
    tol = 1e-3 * float(want.abs().max())
    gemma.reset()
    got, _ = gemma.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    torch.testing.assert_close(got, want, atol=tol, rtol=0)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    gemma.reset()
    gemma.spec_forward(ids[:520], all_logits_rows=False, want_hidden=False)
    decoded = [gemma.spec_forward([t], all_logits_rows=True, want_hidden=False)[0][0] for t in ids[520:525]]
    torch.testing.assert_close(torch.stack(decoded), want[520:525], atol=tol, rtol=0)
    verify, _ = gemma.spec_forward(ids[525:], all_logits_rows=True, want_hidden=False)
    torch.testing.assert_close(verify, want[525:], atol=tol, rtol=0)
    gemma.reset()


PIECES = [
    "Hello, world!", "naïve café déjà vu", "日本語のテキストです。", "中文分词测试", "Привет, мир", "مرحبا بالعالم",
    "👋🏽 emoji 🚀🔥", "a   b\t\tc\n\n\nd", "   leading spaces", "trailing spaces   ", "\n\n", "\t",
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n", "<bos>", "<end_of_turn>",
    "1234567890", "3.14159e-10", "https://example.com/path?q=1&r=two", "ÅÄÖ åäö ß", "x" * 40, "    ", "🙂",
    "SELECT * FROM users WHERE id = 42;", "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}", "C'est l'été!",
    "tab\tseparated\tvalues", "हिन्दी पाठ", "한국어 텍스트", "\u200bzero\u200bwidth", "line1\r\nline2",
]


def _strings(n: int = 200) -> list[str]:
    rng = random.Random(7)
    out = list(PIECES)
    while len(out) < n:
        out.append(rng.choice(["", " ", "\n", "  "]).join(rng.sample(PIECES, rng.randint(2, 4))))
    return out[:n]


def test_tokenizer_matches_transformers(gemma, hf_gemma):
    _, tokenizer = hf_gemma
    strings = _strings()
    assert len(strings) == 200
    mismatched = [s for s in strings if gemma.tokenizer.encode(s) != tokenizer(s)["input_ids"]]
    assert not mismatched, f"{len(mismatched)} of 200 differ, e.g. {mismatched[:3]!r}"
    plain = [s for s in strings if gemma.tokenizer.encode(s, add_special_tokens=False)
             != tokenizer(s, add_special_tokens=False)["input_ids"]]
    assert not plain, f"{len(plain)} of 200 differ without special tokens, e.g. {plain[:3]!r}"


def test_chat_formats_turns_with_the_gemma_built_in(gemma_path, gemma, capsys, monkeypatch, cli_state):
    """The file has no tokenizer.chat_template: `tsspec chat` formats Gemma turns with the
    family's built-in template, says so once, and the reply ends at <end_of_turn>."""
    import io

    from tsspec.cli.app import main
    from tsspec.runtime import generation

    assert gemma.config.extra["chat_template"] == "built-in gemma (the file has none)"
    prompts = []
    real = generation.generate

    def recording(target, prompt, *args, **kwargs):
        prompts.append(target.tokenizer.decode(prompt))
        return real(target, prompt, *args, **kwargs)

    monkeypatch.setattr(generation, "generate", recording)
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2+2? Answer with one digit.\n/exit\n"))
    try:
        main(["chat", "--model", gemma_path, "-n", "8", "--no-spec"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    assert code in (0, None), out.err
    assert prompts == [("<bos><start_of_turn>user\nWhat is 2+2? Answer with one digit.<end_of_turn>\n"
                        "<start_of_turn>model\n")]
    assert out.err.count("no chat template in the file; using the gemma family's built-in one") == 1
    assert out.out.strip()  # a reply was printed
