"""load_llama: one-line ModelLoadErrors for bad files, options, the load cache, registration."""

from __future__ import annotations

import importlib.metadata as metadata

import numpy as np
import pytest
import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf.cache import WeightCache
from tsspec_gguf.gguf_writer import write_gguf
from tsspec_model_llama import load_llama
from tsspec_model_llama.convert import llama_gguf_contents


@pytest.fixture
def contents(tiny):
    model, _, _ = tiny()
    return llama_gguf_contents(model.config, model.state_dict())


def rewrite(tmp_path, contents, *, drop_key=None, set_keys=None, drop=None, replace=None, arch="llama"):
    metadata_, tensors = dict(contents[0]), dict(contents[1])
    if drop_key:
        metadata_.pop(drop_key)
    metadata_.update(set_keys or {})
    if drop:
        tensors.pop(drop)
    tensors.update(replace or {})
    if arch != "llama":
        metadata_ = {k.replace("llama.", f"{arch}.", 1): v for k, v in metadata_.items()}
    return write_gguf(tmp_path / "bad.gguf", arch, metadata_, tensors)


def load_error(path, options=None) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as info:
        load_llama(path, options)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))
    return info.value


def test_missing_tensor_is_named(tmp_path, contents):
    err = load_error(rewrite(tmp_path, contents, drop="blk.1.ffn_up.weight"))
    assert "missing tensor 'blk.1.ffn_up.weight'" in err.problem


def test_wrong_shape_is_named(tmp_path, contents):
    bad = np.zeros((64, 32), np.float32)
    err = load_error(rewrite(tmp_path, contents, replace={"blk.0.attn_k.weight": bad}))
    assert "tensor 'blk.0.attn_k.weight' has shape [64, 32], expected [32, 64]" in err.problem


def test_missing_key_is_named(tmp_path, contents):
    err = load_error(rewrite(tmp_path, contents, drop_key="llama.attention.layer_norm_rms_epsilon"))
    assert "llama.attention.layer_norm_rms_epsilon" in err.problem


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({"llama.attention.head_count_kv": 3}, "do not group"),
        ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, "rope scaling 'yarn'"),
        ({"llama.block_count": 0}, "positive integer"),
        ({"llama.rope.dimension_count": 15}, "must be even"),
        ({"llama.block_count": 3}, "missing tensor 'blk.2."),
        ({"llama.block_count": 1}, "beyond block_count"),
    ],
)
def test_inconsistent_hyperparameters(tmp_path, contents, keys, expected):
    assert expected in load_error(rewrite(tmp_path, contents, set_keys=keys)).problem


def test_other_architectures_and_moe_are_refused(tmp_path, contents):
    assert "not a family this plugin serves" in load_error(rewrite(tmp_path, contents, arch="falcon")).problem
    moe = rewrite(tmp_path, contents, replace={"blk.0.ffn_gate_inp.weight": np.zeros((4, 64), np.float32)})
    assert "mixture-of-experts" in load_error(moe).problem


def test_not_a_gguf_and_truncated(tmp_path, contents):
    text = tmp_path / "notes.gguf"
    text.write_text("just text")
    assert "not a GGUF" in load_error(text).problem
    good = rewrite(tmp_path, contents)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(open(good, "rb").read()[:-100])
    assert "past the end" in load_error(cut).problem
    assert "no such file" in load_error(tmp_path / "absent.gguf").problem


def test_bad_options(tmp_path, contents):
    path = rewrite(tmp_path, contents)
    assert "--dtype 'int3'" in load_error(path, {"dtype": "int3"}).problem
    if not torch.cuda.is_available():
        assert "no CUDA" in load_error(path, {"device": "cuda"}).problem
    assert "not a torch device" in load_error(path, {"device": "warp-drive"}).problem


def test_load_options_object(tmp_path, contents):
    from tsspec.runtime.loading import LoadOptions

    from tsspec_gguf import native

    target = load_llama(rewrite(tmp_path, contents), LoadOptions(device="cpu", dtype="bfloat16"))
    assert target.device.type == "cpu"
    if native.available():  # every matrix kept at 16 bits on the row-invariant kernel
        assert target.dtype == torch.float32 and "BF16 weights kept at 16 bits" in target.config.extra["weights"]
        assert target.config.extra["lossless"].startswith("bit-exact") and "BF16" in target.config.extra["lossless"]
    else:
        assert target.dtype == torch.bfloat16


def test_second_load_comes_from_the_cache(tmp_path, contents):
    path = rewrite(tmp_path, contents)
    cache = WeightCache(tmp_path / "cache")
    first = load_llama(path, cache=cache)
    assert first.cache_hit is False
    second = load_llama(path, cache=cache)
    assert second.cache_hit is True
    ids = [5, 6, 7, 8]
    a, _ = first.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    b, _ = second.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    assert torch.equal(a, b)
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_bytes(entry.read_bytes()[:1000])  # a partial entry is rebuilt, not trusted
    third = load_llama(path, cache=cache)
    assert third.cache_hit is False
    assert torch.equal(third.spec_forward(ids, all_logits_rows=True, want_hidden=False)[0], a)


def test_registered_as_the_llama_plugin(tmp_path, contents):
    import tsspec_model_llama

    (ep,) = [e for e in metadata.entry_points(group="tsspec") if e.name == "llama"]
    assert ep.load() is tsspec_model_llama
    registered = []
    tsspec_model_llama.tsspec_register_models(lambda archs, loader: registered.append((archs, loader)))
    # the hook registers a thin wrapper so importing the plugin stays free of torch
    assert registered == [(["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"], tsspec_model_llama._load)]
    assert tsspec_model_llama.load_llama is load_llama
    from tsspec.runtime.loading import load_model

    target = load_model(rewrite(tmp_path, contents))
    assert type(target).__name__ == "LlamaTarget"
