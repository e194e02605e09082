"""Fixtures: tiny random HF Muse-Glimmer models (the oracle) written as GGUF by the plugin's
converter, and loaded back with the plugin."""

from __future__ import annotations

import os
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")

TINY_TEXT = dict(
    vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, sliding_window=6, max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-5,
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)
TINY_VISION = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
WEIGHT_STD = 0.15


def make_hf_muse(seed: int = 0, *, norm_std: float = 0.3, weight_std: float = WEIGHT_STD, **text_overrides):
    """A random HF MuseGlimmerForConditionalGeneration (tiny vision tower), every weight drawn;
    norm weights around 0 (HF adds 1) with spread ``norm_std`` so the +1 / eps conventions move
    the logits."""
    from transformers.models.muse_glimmer import MuseGlimmerConfig, MuseGlimmerForConditionalGeneration

    text = {**TINY_TEXT, **text_overrides}
    cfg = MuseGlimmerConfig(text_config=text, vision_config=TINY_VISION, out_hidden_size=16,
                            projector_hidden_size=16)
    cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = MuseGlimmerForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "vision" in name:
                continue
            if name.endswith("language_model.norm.weight"):
                param.copy_(1.0 + norm_std * torch.randn_like(param))
            elif "norm" in name:  # 1 + w exact in float32, so the folded GGUF weight is exact
                param.copy_((1.0 + norm_std * torch.randn_like(param)).float() - 1.0)
            else:
                param.copy_(torch.randn_like(param) * weight_std)
    return model


def hf_logits(model, ids) -> torch.Tensor:
    """transformers' logits [len(ids), vocab] for one sequence (float32)."""
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].float()


def write_model(path, model, **kwargs):
    from tsspec_model_muse_glimmer.convert import write_muse_glimmer_gguf

    return write_muse_glimmer_gguf(path, model.config.to_dict(), model.state_dict(), **kwargs)


@pytest.fixture
def tiny(tmp_path):
    """tiny(seed=0, dtype=None, quantize=None, **text_overrides) -> (hf_model, target, path)."""
    from tsspec_model_muse_glimmer import load_muse_glimmer

    counter = iter(range(1000))

    def build(*, seed=0, dtype=None, quantize=None, norm_std=0.3, weight_std=WEIGHT_STD, **overrides):
        model = make_hf_muse(seed, norm_std=norm_std, weight_std=weight_std, **overrides)
        path = write_model(tmp_path / f"muse{next(counter)}.gguf", model, quantize=quantize)
        return model, load_muse_glimmer(path, {"dtype": dtype}), path

    return build


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """Weight caches of these tests go to a temporary directory, never ~/.cache."""
    previous = os.environ.get("TSSPEC_CACHE_DIR")
    os.environ["TSSPEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("weight-cache"))
    yield
    if previous is None:
        os.environ.pop("TSSPEC_CACHE_DIR", None)
    else:
        os.environ["TSSPEC_CACHE_DIR"] = previous


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _no_env_assistant(monkeypatch):
    monkeypatch.delenv("TS_MUSE_GLIMMER_DFLASH", raising=False)


@pytest.fixture
def helpers():
    return types.SimpleNamespace(hf_logits=hf_logits, write_model=write_model, make_hf_muse=make_hf_muse)
