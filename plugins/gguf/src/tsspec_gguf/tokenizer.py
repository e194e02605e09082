"""The tokenizer a GGUF describes, built with the ``tokenizers`` library from ``tokenizer.ggml.*``.

A GGUF carries no ``tokenizer.json``: it stores the vocabulary (``tokens``, ``scores``,
``token_type``), the merges of a byte-level BPE (``merges``), a pre-tokenizer name (``pre``),
special token ids and flags, and the chat template. Two families occur:

* ``gpt2``: byte-level BPE. Tokens are spelled in GPT-2's printable byte alphabet ("Ġthe"). The
  text is split by the regex ``pre`` names (llama.cpp's table), then byte-encoded and merged.
* ``llama``: SentencePiece-style BPE. Tokens use "▁" for a space, bytes are ``<0xAB>`` tokens, and
  merges are implied by the scores (a pair merges with the score of the token it forms).

Token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
Control tokens become special added tokens (matched whole in text, dropped by
``decode(skip_special_tokens=True)``); user-defined ones become plain added tokens.

Example::

    tok = from_gguf(GGUFFile("model.gguf"))
    ids = tok.encode("Hello world")              # BOS added when the file says so
    tok.decode(ids, skip_special_tokens=True)    # "Hello world"
    tok.apply_chat_template([{"role": "user", "content": "hi"}])
"""

from __future__ import annotations

import sys

from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

from tsspec.errors import ModelLoadError
from .chat_template import ChatTemplate

__all__ = ["GGUFTokenizer", "from_gguf", "byte_alphabet", "PRE_TOKENIZER_SPLITS"]

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
SPM_SPACE = "\u2581"  # "▁", SentencePiece's visible space

# The split regexes of llama.cpp's pre-tokenizer types (llama-vocab.cpp), by `tokenizer.ggml.pre`.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DIGIT_SPLIT = r"\p{N}"  # every digit its own piece, before the main split

# pre name -> (splits applied in order, ignore_merges: a piece already in the vocab is one token)
PRE_TOKENIZER_SPLITS: dict[str, tuple[tuple[str, ...], bool]] = {
    **{name: ((GPT2_SPLIT,), False) for name in ("default", "gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion")},
    **{
        name: ((DIGIT_SPLIT, GPT2_SPLIT), False)
        for name in ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva")
    },
    **{
        name: ((LLAMA3_SPLIT,), True)
        for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx",
                     "smaug-bpe", "lfm2", "midm-2.0")
    },
    **{name: ((QWEN2_SPLIT,), False) for name in ("qwen2", "deepseek-r1-qwen", "megrez", "kormo")},
    "qwen35": ((QWEN35_SPLIT,), False),
    **{name: ((GPT4O_SPLIT,), False) for name in ("gpt-4o", "llama4", "minimax-m2")},
}
DEFAULT_PRE = "default"

# Texts of control tokens that end a turn in common chat formats (llama.cpp's end-of-generation
# heuristics): generation stops on any of them, beside the declared eos/eot/eom ids.
END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
        "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<turn|>",
    }
)
END_ID_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map: printable Latin-1 bytes stand for
    themselves, the other 68 bytes take the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class GGUFTokenizer:
    """Implements ``tsspec.protocols.Tokenizer`` over a ``tokenizers.Tokenizer``."""

    def __init__(
        self,
        backend,
        *,
        tokens: Sequence[str],
        bos_token_id: int | None,
        eos_token_id: int | None,
        eos_token_ids: Iterable[int],
        add_bos: bool,
        add_eos: bool,
        chat_template: str | None,
        special_ids: Iterable[int] = (),
        model: str = "",
        pre: str = "",
    ):
        self.backend = backend
        self.tokens = list(tokens)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.eos_token_ids = frozenset(eos_token_ids)
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.special_ids = frozenset(special_ids)
        self.model = model
        self.pre = pre
        self.chat_template_source = chat_template
        self._chat_template: ChatTemplate | None = None
        # set when the template is a built-in the model plugin supplied (the file has none): the
        # line printed on stderr the first time a conversation is rendered with it
        self.chat_template_note: str | None = None

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def token_text(self, token_id: int) -> str:
        return self.tokens[token_id]

    def token_to_id(self, text: str) -> int | None:
        return self.backend.token_to_id(text)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos and self.bos_token_id is not None:
                ids = [self.bos_token_id, *ids]
            if self.add_eos and self.eos_token_id is not None:
                ids = [*ids, self.eos_token_id]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def _special_token_text(self) -> dict[str, str | None]:
        def text(token_id: int | None) -> str | None:
            return self.tokens[token_id] if token_id is not None and 0 <= token_id < len(self.tokens) else None

        return {"bos_token": text(self.bos_token_id), "eos_token": text(self.eos_token_id)}

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template_source)

    def use_builtin_chat_template(self, source: str, note: str) -> None:
        """Render chats with ``source``, a template the model plugin keeps for a file without
        one; ``note`` is printed on stderr when it is first used."""
        self.chat_template_source = source
        self.chat_template_note = note
        self._chat_template = None

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Render the file's chat template (HF conventions), or the built-in one the model plugin
        supplied (its note printed once). Without either, ChatTemplateError."""
        if self._chat_template is None:
            from .chat_template import ChatTemplateError

            if not self.chat_template_source:
                raise ChatTemplateError("the model has no chat template (tokenizer.chat_template)")
            self._chat_template = ChatTemplate(self.chat_template_source, self._special_token_text())
            if self.chat_template_note:
                print(self.chat_template_note, file=sys.stderr)
        return self._chat_template.render(messages, add_generation_prompt=add_generation_prompt, **extra)


# -- building ------------------------------------------------------------------------------------
def _optional_id(gguf_file, key: str, n_tokens: int) -> int | None:
    value = gguf_file.get(key, None)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n_tokens:
        return None  # llama.cpp files sometimes carry -1 / out-of-range ids meaning "none"
    return value


def _added_tokens(tokens: Sequence[str], types: Sequence[int] | None):
    """(special AddedTokens, plain AddedTokens) from the token types."""
    from tokenizers import AddedToken

    special, plain = [], []
    if types is None:
        return special, plain
    for token, token_type in zip(tokens, types):
        if token_type == TOKEN_CONTROL and token:
            special.append(AddedToken(token, special=True, normalized=False))
        elif token_type == TOKEN_USER_DEFINED and token:
            plain.append(AddedToken(token, special=False, normalized=False))
    return special, plain


def _byte_level_backend(gguf_file, tokens: list[str], types: list[int] | None, pre: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    alphabet = byte_alphabet()
    spelled = set(alphabet.values())
    # tokens are spelled in the byte alphabet; a normal token that is not (a raw "é") is
    # re-spelled so merges can reach it; control/user-defined tokens keep their text (matched whole)
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        keep_raw = types is not None and types[index] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
        if not keep_raw and not set(token) <= spelled:
            token = "".join(alphabet[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, index)
    merges_raw = gguf_file.get("tokenizer.ggml.merges", None)
    if merges_raw is None:
        raise ModelLoadError(gguf_file.path, "gpt2 tokenizer without tokenizer.ggml.merges")
    merges = []
    for merge in merges_raw:
        left, sep, right = merge.partition(" ")
        if sep:
            merges.append((left, right))
    splits, ignore_merges = PRE_TOKENIZER_SPLITS.get(pre, PRE_TOKENIZER_SPLITS[DEFAULT_PRE])
    try:
        model = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=ignore_merges)
    except Exception as exc:  # merges naming tokens absent from the vocabulary
        raise ModelLoadError(gguf_file.path, f"tokenizer vocabulary/merges are inconsistent: {exc}") from None
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def _spm_merges(tokens: list[str], scores: Sequence[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Merges implied by a SentencePiece vocabulary: every split of a token into two vocabulary
    pieces is a merge ranked by the token's score (higher first; ties: longer left piece, then
    vocabulary order), which is how SentencePiece's BPE picks the next pair."""
    ranked = []
    for token, score in zip(tokens, scores):
        if vocab.get(token) is None:
            continue
        local = []
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                local.append((vocab[left], vocab[right], left, right))
        local.sort()
        ranked.extend((float(score), len(left), len(right), left, right) for _, _, left, right in local)
    ranked.sort(key=lambda r: (r[0], r[1], r[2]), reverse=True)
    return [(left, right) for _, _, _, left, right in ranked]


def _sentencepiece_backend(gguf_file, tokens: list[str], types: list[int] | None, unk_id: int | None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    scores = gguf_file.get_array("tokenizer.ggml.scores", None)
    if scores is None:
        scores = [0.0] * len(tokens)
    merges_raw = gguf_file.get("tokenizer.ggml.merges", None)
    if merges_raw is not None:
        merges = [tuple(m.split(" ", 1)) for m in merges_raw if " " in m]
    else:
        merges = _spm_merges(tokens, scores, vocab)
    unk = tokens[unk_id] if unk_id is not None else None
    add_prefix = bool(gguf_file.get("tokenizer.ggml.add_space_prefix", True))
    backend = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPM_SPACE, prepend_scheme="first" if add_prefix else "never", split=False
    )
    steps = [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def from_gguf(gguf_file) -> GGUFTokenizer | None:
    """The file's tokenizer, or None when it carries no vocabulary (token-id-only use)."""
    tokens = gguf_file.get("tokenizer.ggml.tokens", None)
    if not tokens:
        return None
    model = gguf_file.get("tokenizer.ggml.model", "llama")
    pre = gguf_file.get("tokenizer.ggml.pre", DEFAULT_PRE) or DEFAULT_PRE
    type_array = gguf_file.get_array("tokenizer.ggml.token_type", None)
    types = None if type_array is None else type_array.tolist()
    if types is not None and len(types) != len(tokens):
        raise ModelLoadError(
            gguf_file.path, f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens"
        )
    n = len(tokens)
    unk_id = _optional_id(gguf_file, "tokenizer.ggml.unknown_token_id", n)
    if model == "gpt2":
        backend = _byte_level_backend(gguf_file, tokens, types, pre)
        default_add_bos = False
    elif model == "llama":
        backend = _sentencepiece_backend(gguf_file, tokens, types, unk_id)
        default_add_bos = True  # llama.cpp adds BOS to a SentencePiece vocabulary unless told not to
    else:
        raise ModelLoadError(
            gguf_file.path, f"tokenizer model {model!r} is not supported (supported: gpt2, llama)"
        )
    special, plain = _added_tokens(tokens, types)
    if special:
        backend.add_special_tokens(special)
    if plain:
        backend.add_tokens(plain)

    bos = _optional_id(gguf_file, "tokenizer.ggml.bos_token_id", n)
    eos = _optional_id(gguf_file, "tokenizer.ggml.eos_token_id", n)
    ends = {i for key in END_ID_KEYS if (i := _optional_id(gguf_file, key, n)) is not None}
    for index, token in enumerate(tokens):
        if token in END_OF_GENERATION_TEXTS and (
            types is None or types[index] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
        ):
            ends.add(index)
    special_ids = [i for i, t in enumerate(types or ()) if t == TOKEN_CONTROL]
    return GGUFTokenizer(
        backend,
        tokens=tokens,
        bos_token_id=bos,
        eos_token_id=eos,
        eos_token_ids=ends,
        add_bos=bool(gguf_file.get("tokenizer.ggml.add_bos_token", default_add_bos)),
        add_eos=bool(gguf_file.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=gguf_file.get("tokenizer.chat_template", None),
        special_ids=special_ids,
        model=model,
        pre=pre,
    )
