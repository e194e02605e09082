"""Detokenizer / TextStream: streamed deltas add up to the one-shot decode (multilingual text,
emoji split across byte tokens, SentencePiece's leading space, random ids), stop strings that
straddle deltas cut exactly where a one-shot cut would, and a token's decode work does not grow
with the answer's length."""

from __future__ import annotations

import random

import numpy as np
import pytest
from gguf import GGUFValueType as V

from tsspec_gguf.embedded import embedded_model_path
from tsspec_gguf.gguf_file import GGUFFile
from tsspec_gguf.gguf_writer import write_gguf
from tsspec_gguf.tokenizer import from_gguf
from tsspec.runtime.text_stream import Detokenizer, TextStream

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Ünïcödé façade naïve café, Straße",
    "日本語のテキストと漢字、中文也可以。",
    "Привет, мир! Ёлка и ёж",
    "مرحبا بالعالم",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 and ✨",
    "math ∑ x² ≤ ½ · π ≈ 3.14159 ٣٤٥",
    "def f(x):\n    return x ** 2  # 平方\n\n",
    "  leading spaces and trailing  ",
]


class CountingTokenizer:
    """A tokenizer whose decode calls are recorded by the number of ids each was given."""

    def __init__(self, inner):
        self.inner = inner
        self.sizes: list[int] = []

    def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        self.sizes.append(len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    def __getattr__(self, name):  # encode, eos_token_ids...: the wrapped tokenizer's
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def smol():
    return from_gguf(GGUFFile(embedded_model_path()))


def _streamed(tokenizer, ids) -> list[str]:
    d = Detokenizer(tokenizer)
    return [d.push(t) for t in ids] + [d.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_one_shot_decode(smol, text):
    ids = smol.encode(text, add_special_tokens=False)
    pieces = _streamed(smol, ids)
    assert "".join(pieces) == smol.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in p for p in pieces)  # half a character is never released


def test_an_emoji_split_across_byte_tokens_is_released_whole(smol):
    ids = smol.encode("hi 😀!", add_special_tokens=False)
    assert len(ids) == 4  # "😀" is two tokens in SmolLM2's vocabulary
    assert _streamed(smol, ids) == ["hi", "", " 😀", "!", ""]


def test_chat_answers_with_special_tokens_skip_them(smol):
    text = smol.apply_chat_template([{"role": "user", "content": "Salut 👋"}]) + "Bonjour 😀<|im_end|>"
    ids = smol.encode(text, add_special_tokens=False)
    assert "".join(_streamed(smol, ids)) == smol.decode(ids, skip_special_tokens=True)


def test_random_ids_decode_the_same_streamed(smol):
    """Any id sequence, invalid UTF-8 included: the pieces add up to the one-shot decode."""
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(smol.vocab_size) for _ in range(rng.randint(1, 40))]
        assert "".join(_streamed(smol, ids)) == smol.decode(ids, skip_special_tokens=True), ids


def test_a_trailing_incomplete_character_is_flushed_as_the_one_shot_decode_has_it(smol):
    ids = smol.encode("ok 😀", add_special_tokens=False)[:-1]  # the emoji's first byte token only
    d = Detokenizer(smol)
    streamed = "".join(d.push(t) for t in ids)
    assert not streamed.endswith("\ufffd")
    assert streamed + d.flush() == smol.decode(ids, skip_special_tokens=True)


def test_sentencepiece_leading_spaces_survive_windows(tmp_path):
    """SentencePiece's decoder strips one leading space of whatever it is given: a window that
    starts at "▁world" must not lose that word's space."""
    pieces = ["▁", "▁hello", "▁world", "he", "llo", "▁▁"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    path = write_gguf(tmp_path / "spm.gguf", "llama", {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": ([0.0] * 259 + [-float(i) for i in range(len(pieces))], (V.ARRAY, V.FLOAT32)),
        "tokenizer.ggml.token_type": ([2, 3, 3] + [6] * 256 + [1] * len(pieces), (V.ARRAY, V.INT32)),
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
    }, {"token_embd.weight": np.zeros((len(tokens), 4), np.float32)})
    tok = from_gguf(GGUFFile(path))
    for text in ["hello world hello", "hello  world", "hello é world 😀 hello", "hello   hello"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert "".join(_streamed(tok, ids)) == tok.decode(ids, skip_special_tokens=True), text
    rng = random.Random(1)
    units = [[tok.token_to_id(p)] for p in pieces] + [tok.encode(c, add_special_tokens=False) for c in "é😀ж"]
    for _ in range(20):
        ids = [i for _ in range(rng.randint(1, 20)) for i in rng.choice(units)]
        assert "".join(_streamed(tok, ids)) == tok.decode(ids, skip_special_tokens=True), ids
    # a limit: a run of byte tokens that is not UTF-8 decodes to one U+FFFD per byte at once,
    # valid bytes included, while the stream had released the valid bytes before the run broke
    ids = [tok.token_to_id("<0x41>"), tok.token_to_id("<0xC3>"), tok.token_to_id("<0x41>")]
    assert tok.decode(ids) == "\ufffd" * 3 and _streamed(tok, ids) == ["A", "", "", "\ufffd\ufffd"]


# -- stop strings ---------------------------------------------------------------------------------


def _stream_with_stop(tokenizer, ids, stop):
    stream = TextStream(tokenizer, stop)
    pieces, used = [], 0
    for t in ids:
        pieces.append(stream.push(t))
        used += 1
        if stream.stopped:
            break
    pieces.append(stream.finish())
    return pieces, stream, ids[:used]


def _one_shot_cut(text: str, stop) -> str:
    found = [text.find(s) for s in stop if s and s in text]
    return text[: min(found)] if found else text


def test_stop_strings_straddling_deltas_cut_exactly(smol):
    text = "The café serves 日本茶 and 😀 cookies; the café closes at nine."
    ids = smol.encode(text, add_special_tokens=False)
    full = smol.decode(ids)
    spans, pos = [], 0  # each token's (start, end) in the text
    for i in range(len(ids)):
        end = len(smol.decode(ids[: i + 1]).rstrip("\ufffd"))
        spans.append((pos, end))
        pos = end
    straddling = 0
    for start in range(len(full) - 2):
        for width in (2, 3, 5):
            stop = full[start: start + width]
            if "\ufffd" in stop:
                continue
            pieces, stream, used = _stream_with_stop(smol, ids, [stop])
            expected = _one_shot_cut(smol.decode(used, skip_special_tokens=True), [stop])
            assert "".join(pieces) == stream.text == expected == full[: full.find(stop)], stop
            assert stream.stopped
            straddling += any(a < start < b < start + width for a, b in spans if b > a)
    assert straddling > 20  # most of these stop strings began in one delta and ended in a later one


def test_the_earliest_of_several_stop_strings_wins(smol):
    ids = smol.encode("alpha beta gamma delta", add_special_tokens=False)
    for stop in (["gamma", "beta"], ["beta", "gamma"], ["a g", "ta"], ["nowhere"]):
        pieces, stream, used = _stream_with_stop(smol, ids, stop)
        assert "".join(pieces) == _one_shot_cut(smol.decode(used), stop), stop
        assert stream.stopped == (stop != ["nowhere"])
    pieces, stream, _ = _stream_with_stop(smol, ids, ["beta", "alpha beta g"])
    assert "".join(pieces) == "alpha "  # both complete in the same token: the earlier start


def test_text_that_may_begin_a_stop_string_is_held_then_released(smol):
    ids = smol.encode("one two three", add_special_tokens=False)
    stream = TextStream(smol, ["two threes"])
    pieces = [stream.push(t) for t in ids]
    assert "".join(pieces) == "one "  # "two three" might still become the stop string
    assert stream.finish() == "two three" and not stream.stopped
    assert stream.text == "one two three"


# -- the work per token -----------------------------------------------------------------------


def test_decode_work_per_token_does_not_grow_with_the_answer(smol):
    ids = smol.encode(" ".join(TEXTS) * 6, add_special_tokens=False)
    assert len(ids) > 600
    counting = CountingTokenizer(smol)
    stream = TextStream(counting, ["never appears in the text"])
    streamed = "".join(stream.push(t) for t in ids) + stream.finish()
    assert streamed == smol.decode(ids, skip_special_tokens=True)
    # each push decodes a window of a few ids, at most twice, however long the answer is
    assert max(counting.sizes) <= 8, max(counting.sizes)
    assert len(counting.sizes) <= 2 * len(ids) + 2
    assert sum(counting.sizes) <= 8 * len(ids)
    early, late = counting.sizes[:200], counting.sizes[-200:]
    assert max(late) <= max(early)


def test_generate_streams_with_windowed_decodes():
    """The engine's streaming path (``generate(on_token=...)``, which the server's scheduler
    runs) decodes windows, not the whole answer, for every token."""
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.testing import ToyTarget

    target = ToyTarget(seed=0)
    counting = CountingTokenizer(target.tokenizer)
    target.tokenizer = counting
    pieces: list[str] = []
    result = generate(target, "hello world", SpeculationOptions(enabled=False), max_tokens=120,
                      on_token=lambda tok, piece: pieces.append(piece) and None)
    assert len(result.tokens) == 120
    assert "".join(pieces) == result.text == counting.inner.decode(result.tokens, skip_special_tokens=True)
    assert max(counting.sizes) <= 4, max(counting.sizes)
