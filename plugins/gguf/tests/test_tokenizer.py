"""GGUFTokenizer: round trips on the embedded vocabulary, equality with transformers' GGUF
tokenizer (byte-level BPE and SentencePiece), special tokens, chat templates."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from gguf import GGUFValueType as V
from hypothesis import assume, given, settings, strategies as st

from tsspec_gguf.chat_template import ChatTemplate, ChatTemplateError
from tsspec_gguf.embedded import embedded_model_path
from tsspec_gguf.gguf_file import GGUFFile
from tsspec_gguf.gguf_writer import write_gguf
from tsspec_gguf.tokenizer import GGUFTokenizer, byte_alphabet, from_gguf
from tsspec.protocols import Tokenizer

SMOL = embedded_model_path()

CODE = [
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += x[i]; }",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)  # shape [3, 4]",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "fn main() {\n\tprintln!(\"{}\", 42);\n}",
    "<div class=\"a\">&nbsp;</div>\r\n",
    "    \n\n\t\t  mixed   \t whitespace\n\n\n",
]
UNICODE = [
    "Ünïcödé façade naïve café",
    "日本語のテキストと漢字",
    "Привет, мир! Ёлка",
    "مرحبا بالعالم",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "math ∑ x² ≤ ½ · π ≈ 3.14159 ٣٤٥",
    "zero\u200bwidth and nbsp\u00a0here",
    "ℌ𝔢𝔩𝔩𝔬 𝕨𝕠𝕣𝕝𝕕",
]
SPECIAL = [
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|>",
    "not special: <|im_start  and |im_end|>",
]
WORDS = ["I'm", "don't", "YOU'LL", "they've", "the", "The", "1234567", "3.14", "foo_bar", "camelCase",
         "e-mail", "https://example.com/a?b=c", "$100", "#tag", "@user", "...", "!!", "''", '"q"', "é", "😀",
         "\t", "\n", "  ", "   ", "\r\n", "x86_64", "1st", "2nd", "--flag=value"]


def varied_strings(n: int, seed: int = 0) -> list[str]:
    """Fixed examples plus ``n`` random joins of words, code and unicode with varied spacing."""
    rng = random.Random(seed)
    pool = WORDS + [w for s in CODE + UNICODE for w in s.split(" ")]
    out = CODE + UNICODE + SPECIAL + [" leading", "trailing ", "", " ", "a", "\n\n"]
    separators = [" ", "  ", "\n", "\t", "", " \n ", "   "]
    for _ in range(n):
        parts = [rng.choice(pool) for _ in range(rng.randint(1, 12))]
        text = "".join(p + rng.choice(separators) for p in parts)
        out.append(text if rng.random() < 0.7 else " " + text)
    return out


@pytest.fixture(scope="module")
def smol() -> GGUFTokenizer:
    tok = from_gguf(GGUFFile(SMOL))
    assert tok is not None
    return tok


@pytest.fixture(scope="module")
def hf_smol():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(SMOL), gguf_file=os.path.basename(SMOL))


def test_protocol_and_special_ids(smol):
    assert isinstance(smol, Tokenizer)
    assert smol.model == "gpt2" and smol.pre == "smollm"
    assert smol.vocab_size == 49152
    assert smol.bos_token_id == 1 and not smol.add_bos
    assert smol.tokens[smol.eos_token_id] == "<|im_end|>"
    # eos (<|im_end|>) and the other end-of-turn control token (<|endoftext|>)
    assert {smol.tokens[i] for i in smol.eos_token_ids} == {"<|im_end|>", "<|endoftext|>"}
    assert smol.encode("<|im_start|>") == [1]


def test_round_trip_real_vocab(smol):
    for text in varied_strings(150, seed=1):
        ids = smol.encode(text)
        assert all(0 <= i < smol.vocab_size for i in ids)
        assert smol.decode(ids) == text


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=40))
def test_round_trip_any_text(text):
    tok = _cached_smol()
    # SmolLM2's vocabulary lacks 21 of the 256 byte tokens (a few C0 controls and bytes that
    # start code points >= U+40000): text using them cannot be encoded by any implementation
    alphabet = byte_alphabet()
    assume(all(tok.token_to_id(alphabet[b]) is not None for b in text.encode("utf-8")))
    assert tok.decode(tok.encode(text)) == text


_SMOL_CACHE: list[GGUFTokenizer] = []


def _cached_smol() -> GGUFTokenizer:
    if not _SMOL_CACHE:
        _SMOL_CACHE.append(from_gguf(GGUFFile(SMOL)))
    return _SMOL_CACHE[0]


def test_skip_special_tokens(smol):
    ids = smol.encode("<|im_start|>user\nhello<|im_end|>")
    assert smol.decode(ids, skip_special_tokens=True) == "user\nhello"


def test_digits_split_one_by_one_as_llama_cpp_smollm(smol):
    # llama.cpp's `smollm` pre-tokenizer isolates every \p{N} before the GPT-2 split
    pieces = [smol.tokens[i] for i in smol.encode("x 2024 ²")]
    assert pieces == ["x", "Ġ", "2", "0", "2", "4", "Ġ", "Â²"]


def _with_smollm_digit_split(hf_tokenizer):
    """transformers' GGUF tokenizer with SmolLM2's own pre-tokenizer (its tokenizer.json: every
    digit isolated, then GPT-2 byte-level), which is also llama.cpp's `smollm` type. transformers'
    GGUF loader knows no `smollm` entry and falls back to plain GPT-2 byte-level splitting."""
    from tokenizers import Tokenizer, pre_tokenizers

    backend = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    return backend


@pytest.mark.oracle
def test_equal_to_transformers_gguf_tokenizer(smol, hf_smol):
    texts = varied_strings(300, seed=2)
    with_digit_split = _with_smollm_digit_split(hf_smol)
    for text in texts:
        ours = smol.encode(text)
        assert ours == with_digit_split.encode(text, add_special_tokens=False).ids, text
        if not any(ch.isnumeric() for ch in text):  # the split only matters next to numerics
            assert ours == hf_smol.encode(text, add_special_tokens=True), text
        assert smol.decode(ours) == hf_smol.decode(ours)
        assert smol.decode(ours, skip_special_tokens=True) == hf_smol.decode(ours, skip_special_tokens=True)


@pytest.mark.oracle
def test_chat_template_equals_transformers(smol, hf_smol):
    conversations = [
        [{"role": "user", "content": "Rewrite this: def f(x): return x+1"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "Q2 with unicode é 😀"},
        ],
    ]
    for messages in conversations:
        for gen in (True, False):
            ours = smol.apply_chat_template(messages, add_generation_prompt=gen)
            theirs = hf_smol.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert ours == theirs
            assert smol.encode(ours) == hf_smol.encode(theirs)


def test_chat_template_helpers():
    template = ChatTemplate(
        "{% if messages|length == 0 %}{{ raise_exception('no messages') }}{% endif %}"
        "{{ bos_token }}{% for m in messages %}{{ m|tojson }}{% generation %}!{% endgeneration %}{% endfor %}"
        "{{ strftime_now('%Y') | length }}",
        {"bos_token": "<s>"},
    )
    assert template.render([{"role": "user", "content": "é<"}]) == '<s>{"role": "user", "content": "é<"}!4'
    with pytest.raises(ChatTemplateError, match="no messages"):
        template.render([])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_no_vocabulary_means_no_tokenizer(tmp_path):
    path = write_gguf(tmp_path / "bare.gguf", "llama", {"llama.block_count": 1}, {"w": np.zeros(4, np.float32)})
    assert from_gguf(GGUFFile(path)) is None


def test_byte_alphabet_is_a_bijection():
    alphabet = byte_alphabet()
    assert len(set(alphabet.values())) == 256
    assert alphabet[ord("A")] == "A" and alphabet[ord(" ")] == "Ġ" and alphabet[ord("\n")] == "Ċ"


# -- SentencePiece-style (`llama`) vocabularies --------------------------------------------------
SPM_PIECES = ["▁", "a", "b", "c", "d", "e", "h", "l", "o", "r", "w", "t", "▁t", "▁th", "▁the", "he", "ll",
              "llo", "▁he", "▁hello", "▁w", "or", "▁wor", "ld", "▁world", "▁a", "ab", "abc", "▁ab", "er", "▁c",
              "▁▁", "▁▁▁▁"]


def write_spm_gguf(path, *, add_space_prefix: bool | None = None, chat_template: str | None = None) -> str:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES + ["<|user|>"]
    scores = [0.0] * 259 + [-float(i) for i in range(len(SPM_PIECES))] + [0.0]
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES) + [4]
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": (scores, (V.ARRAY, V.FLOAT32)),
        "tokenizer.ggml.token_type": (types, (V.ARRAY, V.INT32)),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    if add_space_prefix is not None:
        meta["tokenizer.ggml.add_space_prefix"] = add_space_prefix
    if chat_template:
        meta["tokenizer.chat_template"] = chat_template
    return write_gguf(path, "llama", meta, {"token_embd.weight": np.zeros((len(tokens), 8), np.float32)})


SPM_TEXTS = ["hello world", "the abc", "  hello  world ", "xyz é 😀", "</s>hello<s>", "", " ", "hello\nworld",
             "<|user|>hello", "    the", "abcabc ab c", "world" * 3]


@pytest.mark.oracle
def test_sentencepiece_vocab_equals_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    path = write_spm_gguf(tmp_path / "spm.gguf")
    ours = from_gguf(GGUFFile(path))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    assert ours.add_bos and ours.bos_token_id == 1
    for text in SPM_TEXTS:
        ids = ours.encode(text)
        assert ids == hf.encode(text), text
        assert ours.decode(ids) == hf.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


def test_sentencepiece_round_trip_and_bytes(tmp_path):
    tok = from_gguf(GGUFFile(write_spm_gguf(tmp_path / "spm.gguf")))
    assert tok.encode("hello world") == [1, tok.token_to_id("▁hello"), tok.token_to_id("▁world")]
    ids = tok.encode("xyz é", add_special_tokens=False)
    assert tok.token_to_id("<0xC3>") in ids  # é falls back to its UTF-8 bytes
    for text in SPM_TEXTS:
        if text[:1].isspace() or "<s>" in text or "</s>" in text:
            continue  # the decoder strips the one prefix space of the first piece (as HF does)
        assert tok.decode(tok.encode(text), skip_special_tokens=True) == text


def test_sentencepiece_without_space_prefix(tmp_path):
    tok = from_gguf(GGUFFile(write_spm_gguf(tmp_path / "spm.gguf", add_space_prefix=False)))
    first = tok.tokens[tok.encode("hello", add_special_tokens=False)[0]]
    assert not first.startswith("▁")  # no space prefix: "he", not "▁hello"
    with_prefix = from_gguf(GGUFFile(write_spm_gguf(tmp_path / "spm2.gguf")))
    assert with_prefix.tokens[with_prefix.encode("hello", add_special_tokens=False)[0]] == "▁hello"
    assert tok.decode(tok.encode(" hello", add_special_tokens=False)) == " hello"
