"""The llama converter behind ``tsspec convert``: a HF checkpoint directory in, a GGUF the plugin
loads out, with transformers' logits (f32) and close ones (q8_0)."""

from __future__ import annotations

import json

import pytest
import tsspec_gguf
import torch

from .conftest import make_hf_llama


def _checkpoint(tmp_path, model):
    from safetensors.torch import save_file

    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(model.config.to_dict()))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:  # a tied checkpoint stores the embedding once
        state.pop("lm_head.weight", None)
    save_file(state, str(src / "model.safetensors"))
    return src


@pytest.mark.parametrize("outtype, tol", [("f32", 1e-4), ("q8_0", 5e-2)])
def test_hf_directory_converts_and_matches_transformers(tmp_path, outtype, tol):
    from tsspec.plugins import PluginHost
    from tsspec.runtime.catalog import build_catalog
    from tsspec.runtime.converting import convert_checkpoint
    from tsspec.runtime.loading import load_model

    import tsspec_model_llama

    model = make_hf_llama(3, hidden_size=64, intermediate_size=96)
    src = _checkpoint(tmp_path, model)
    _byte_level_tokenizer(src)
    host = PluginHost()
    host.register(tsspec_model_llama, "llama")
    host.register(tsspec_gguf, "gguf")  # the file toolkit the core reads model files through
    catalog = build_catalog(host, discover=False)
    out = tmp_path / f"out-{outtype}.gguf"
    assert convert_checkpoint(catalog, src, out, outtype=outtype)[0] == "llama"
    target = load_model(out, catalog=catalog)
    ids = [5, 17, 3, 250, 9, 9, 41]
    logits, _ = target.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    assert ((logits - ref).abs().max() / ref.abs().max()).item() < tol


TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
TEXTS = ["Hello world, hello again!", "  spaced   out\n\nlines", "naïve café 123", "<|im_start|>user\nhi<|im_end|>"]


def _byte_level_tokenizer(src):
    """A 300-entry byte-level BPE trained here, saved as a checkpoint's tokenizer files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXTS * 20 + ["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>", "chat_template": TEMPLATE}))
    return tok


def _spm_tokenizer(src):
    """A SentencePiece-style BPE with byte fallback (llama 2 / gemma layout), built by hand."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ("▁", "a", "b", "c", "▁a", "ab", "▁ab", "bc", "▁c"):
        vocab[piece] = len(vocab)
    merges = [("▁", "a"), ("a", "b"), ("▁a", "b"), ("b", "c"), ("▁", "c")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<s>",
                                                           "add_bos_token": True}))
    return tok


def _catalog():
    from tsspec.plugins import PluginHost
    from tsspec.runtime.catalog import build_catalog

    import tsspec_model_llama

    host = PluginHost()
    host.register(tsspec_model_llama, "llama")
    host.register(tsspec_gguf, "gguf")
    return build_catalog(host, discover=False)


def test_the_tokenizer_chat_template_and_special_tokens_are_written(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from tsspec.runtime.converting import convert_checkpoint
    from tsspec.runtime.loading import load_model

    src = _checkpoint(tmp_path, make_hf_llama(3))
    _byte_level_tokenizer(src)
    catalog = _catalog()
    out = tmp_path / "full.gguf"
    convert_checkpoint(catalog, src, out)
    target = load_model(out, catalog=catalog)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(src / "tokenizer.json"))
    for text in TEXTS + ["unseen wörds 987 and\ttabs"]:
        assert target.tokenizer.encode(text) == hf(text)["input_ids"], text
    assert target.tokenizer.has_chat_template
    chat = target.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert "<|im_start|>user\nhi<|im_end|>" in (chat if isinstance(chat, str) else target.tokenizer.decode(chat))


def test_a_sentencepiece_tokenizer_with_byte_fallback_is_written(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from tsspec.runtime.converting import convert_checkpoint
    from tsspec.runtime.loading import load_model

    src = _checkpoint(tmp_path, make_hf_llama(3))
    _spm_tokenizer(src)
    catalog = _catalog()
    out = tmp_path / "spm.gguf"
    convert_checkpoint(catalog, src, out)
    target = load_model(out, catalog=catalog)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(src / "tokenizer.json"))
    for text in ["ab ab a", "abc c", "xyz é", "a  b"]:  # no leading space: see tokenizer_export's note
        assert target.tokenizer.encode(text) == [1] + hf(text)["input_ids"], text


def test_what_is_missing_is_named(tmp_path):
    from tsspec.errors import ModelLoadError
    from tsspec.runtime.converting import convert_checkpoint

    src = _checkpoint(tmp_path, make_hf_llama(3))
    catalog = _catalog()
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        convert_checkpoint(catalog, src, tmp_path / "x.gguf")
    _byte_level_tokenizer(src)
    (src / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    with pytest.raises(ModelLoadError, match="no eos_token"):
        convert_checkpoint(catalog, src, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "phi3", "gemma2", "gemma3"])
def test_each_family_converts_and_matches_transformers(tmp_path, arch):
    from tsspec.runtime.converting import convert_checkpoint
    from tsspec.runtime.loading import load_model

    from .test_families import IDS, _hf

    model = _hf(arch)
    src = _checkpoint(tmp_path, model)
    _byte_level_tokenizer(src)
    catalog = _catalog()
    out = tmp_path / f"{arch}.gguf"
    assert convert_checkpoint(catalog, src, out)[1].plugin == "llama"
    target = load_model(out, catalog=catalog)
    assert target.config.architecture == arch
    logits, _ = target.spec_forward(IDS, all_logits_rows=True, want_hidden=False)
    with torch.no_grad():
        ref = model(torch.tensor([IDS])).logits[0]
    assert ((logits - ref).abs().max() / ref.abs().max()).item() < 1e-4
