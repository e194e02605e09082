"""A Hugging Face checkpoint's tokenizer as GGUF ``tokenizer.ggml.*`` metadata (what converters write).

Reads ``tokenizer.json`` (a BPE model: byte-level, written as ``gpt2`` with the pre-tokenizer
name whose split regexes match, or SentencePiece-style with byte fallback, written as ``llama``
with its merges), ``tokenizer_config.json`` (special tokens, ``add_bos_token``, the chat
template) and ``chat_template.jinja`` when present. Anything the file would need and the
checkpoint lacks is a ModelLoadError naming it; a checkpoint without a chat template converts
with a one-line note (base models have none).

A SentencePiece tokenizer.json with a ``Prepend("▁")`` normalizer puts "▁" before a text that
already starts with a space; tsspec's GGUF tokenizer (like transformers' tokenizer built from a
GGUF) does not, so such texts may tokenize differently after conversion.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tsspec.errors import ModelLoadError
from tsspec_gguf.tokenizer import (
    DIGIT_SPLIT, PRE_TOKENIZER_SPLITS, SPM_SPACE, TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
)


def _content(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _steps(node: dict | None) -> list[dict]:
    if not node:
        return []
    return list(node.get("pretokenizers") or node.get("normalizers") or [node])


def _pre_name(src: Path, pre_tokenizer: dict | None, ignore_merges: bool) -> str:
    """The ``tokenizer.ggml.pre`` whose splits (and ignore_merges) are this tokenizer's."""
    splits = []
    for step in _steps(pre_tokenizer):
        if step.get("type") == "Split":
            pattern = step.get("pattern") or {}
            splits.append(pattern.get("Regex") or pattern.get("String"))
        elif step.get("type") == "Digits" and step.get("individual_digits"):
            splits.append(DIGIT_SPLIT)
        elif step.get("type") == "ByteLevel" and step.get("use_regex", True):
            splits.append(PRE_TOKENIZER_SPLITS["gpt2"][0][0])
    for name, (known, ignores) in PRE_TOKENIZER_SPLITS.items():
        if list(known) == splits and ignores == ignore_merges:
            return name
    raise ModelLoadError(src, f"tokenizer.json's pre-tokenizer splits {splits} match no GGUF pre-tokenizer tsspec knows")


def tokenizer_metadata(src_dir: str | Path) -> dict[str, Any]:
    """``tokenizer.ggml.*`` keys for ``write_gguf(tokenizer=...)`` from a checkpoint directory."""
    src = Path(src_dir)
    path = src / "tokenizer.json"
    if not path.is_file():
        raise ModelLoadError(src, "no tokenizer.json: the GGUF would have no tokenizer (add the checkpoint's tokenizer files)")
    spec = json.loads(path.read_text(encoding="utf-8"))
    config_path = src / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise ModelLoadError(src, f"tokenizer.json has a {model.get('type')!r} model; only BPE tokenizers convert")
    vocab: dict[str, int] = dict(model.get("vocab") or {})
    added = {t["content"]: t for t in spec.get("added_tokens") or []}
    for text, token in added.items():
        vocab.setdefault(text, int(token["id"]))
    size = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(size)]
    for text, index in vocab.items():
        tokens[index] = text
    byte_level = any(s.get("type") == "ByteLevel" for s in _steps(spec.get("pre_tokenizer")))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    types = []
    unk = model.get("unk_token")
    for text in tokens:
        token = added.get(text)
        if token is not None:
            types.append(TOKEN_CONTROL if token.get("special") else TOKEN_USER_DEFINED)
        elif text == unk:
            types.append(TOKEN_UNKNOWN)
        elif not byte_level and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types.append(TOKEN_BYTE)
        else:
            types.append(TOKEN_NORMAL)
    meta: dict[str, Any] = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                            "tokenizer.ggml.merges": merges}
    if byte_level:
        meta["tokenizer.ggml.model"] = "gpt2"
        meta["tokenizer.ggml.pre"] = _pre_name(src, spec.get("pre_tokenizer"), bool(model.get("ignore_merges")))
    elif model.get("byte_fallback"):
        meta["tokenizer.ggml.model"] = "llama"
        meta["tokenizer.ggml.scores"] = [float(-i) for i in range(size)]
        normalizers = _steps(spec.get("normalizer")) + _steps(spec.get("pre_tokenizer"))
        prefix = any(s.get("type") == "Prepend" and s.get("prepend") == SPM_SPACE for s in normalizers) or any(
            s.get("type") == "Metaspace" and s.get("prepend_scheme", "always") != "never" for s in normalizers)
        meta["tokenizer.ggml.add_space_prefix"] = prefix
    else:
        raise ModelLoadError(src, "tokenizer.json is neither byte-level BPE nor BPE with byte fallback")
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"), ("padding", "pad_token")):
        text = _content(config.get(name)) or _content(spec.get(name))
        if text is not None and text in vocab:
            meta[f"tokenizer.ggml.{key}_token_id"] = vocab[text]
    if "tokenizer.ggml.eos_token_id" not in meta:
        raise ModelLoadError(src, "tokenizer_config.json names no eos_token in the vocabulary: generation could not stop")
    meta["tokenizer.ggml.add_bos_token"] = bool(config.get("add_bos_token", False))
    template = config.get("chat_template")
    if (src / "chat_template.jinja").is_file():
        template = (src / "chat_template.jinja").read_text(encoding="utf-8")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if template:
        meta["tokenizer.chat_template"] = template
    else:
        print(f"tsspec: note: {src}: no chat template in the checkpoint; the GGUF has none (--chat will refuse it)",
              file=sys.stderr)
    return meta
