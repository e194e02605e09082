"""Loading: hyper-parameters from the file, one-line errors for bad files and options."""

from __future__ import annotations

import pytest
import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf import native


def _metadata_of(model):
    from tsspec_model_muse_glimmer.convert import muse_glimmer_gguf

    return muse_glimmer_gguf(model.config.to_dict(), model.state_dict())


def test_hparams_from_the_file(tiny):
    _, target, _ = tiny(sliding_window=5)
    hp = target.hparams
    assert (hp.n_layers, hp.hidden_size, hp.n_heads, hp.n_kv_heads, hp.head_dim) == (4, 64, 4, 2, 16)
    assert hp.sliding == (True, True, True, False) and hp.sliding_window == 5
    assert hp.logit_scale == pytest.approx(0.19611613513818404) and hp.softcap == 20.0
    assert target.config.architecture == "muse-glimmer"
    assert target.speculation_profitable and target.spec_verify_persists_accepted_kv


def test_scalar_pattern_period_is_llama_cpp_rule():
    from tsspec_model_muse_glimmer.hparams import layer_pattern

    assert layer_pattern(4, 8, "f", "k") == (True, True, True, False) * 2
    assert layer_pattern(0, 3, "f", "k") == (True,) * 3
    with pytest.raises(ModelLoadError, match="one bool per layer"):
        layer_pattern([True, False], 3, "f", "k")


@pytest.mark.parametrize("edit,message", [
    (lambda m, t: t.pop("blk.1.attn_gate.weight"), "blk.1.attn_gate.weight"),
    (lambda m, t: m.pop("muse-glimmer.attention.sliding_window"), "sliding_window"),
    (lambda m, t: m.__setitem__("muse-glimmer.attention.sliding_window_pattern", [True]), "one bool per layer"),
    (lambda m, t: m.__setitem__("muse-glimmer.attention.head_count_kv", 3), "do not group"),
])
def test_bad_files_are_one_line_errors(tmp_path, helpers, edit, message):
    from tsspec_gguf.gguf_writer_util import write_gguf
    from tsspec_model_muse_glimmer import load_muse_glimmer

    metadata, tensors = _metadata_of(helpers.make_hf_muse(0))
    edit(metadata, tensors)
    path = write_gguf(tmp_path / "bad.gguf", "muse-glimmer", metadata, tensors)
    with pytest.raises(ModelLoadError, match=message):
        load_muse_glimmer(path)


def test_bad_options(tiny):
    from tsspec_model_muse_glimmer import load_muse_glimmer

    _, _, path = tiny()
    with pytest.raises(ModelLoadError, match="float32 or float64"):
        load_muse_glimmer(path, {"dtype": "int8"})
    with pytest.raises(ModelLoadError, match="runs on cpu or cuda"):
        load_muse_glimmer(path, {"device": "meta"})
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA device"):
            load_muse_glimmer(path, {"device": "cuda"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_trunk_equals_the_cpu_reference(tiny):
    """--device cuda runs the torch layers on the device; logits match the float32 CPU ones."""
    from tsspec_model_muse_glimmer import load_muse_glimmer

    _, _, path = tiny()
    ids = [5, 9, 2, 3, 17, 8]
    cpu = load_muse_glimmer(path, {"dtype": "float32"}).spec_forward(ids, all_logits_rows=True, want_hidden=False)[0]
    cuda = load_muse_glimmer(path, {"dtype": "float32", "device": "cuda"})
    logits = cuda.spec_forward(ids, all_logits_rows=True, want_hidden=False)[0]
    assert logits.device.type == "cpu"
    assert float((logits - cpu).abs().max() / cpu.abs().max()) < 1e-4


def test_registered_through_the_plugin_host(tiny):
    """The entry point serves the architecture through ``tsspec.load_model``."""
    import tsspec

    _, _, path = tiny()
    target = tsspec.load_model(str(path))
    assert type(target).__name__ == "MuseGlimmerTarget"


@pytest.mark.skipif(not native.available(),
                    reason="the weight cache holds prepared blocks, which need the compiled kernels")
def test_warm_load_from_the_weight_cache(tiny):
    """The second load maps the prepared blocks back from the cache; same logits bit for bit."""
    from tsspec_gguf.cache import WeightCache
    from tsspec_gguf.gguf_file import GGUFFile
    from tsspec_model_muse_glimmer import load_muse_glimmer
    from tsspec_model_muse_glimmer.hparams import read_hparams
    from tsspec_model_muse_glimmer.weights import load_weights

    _, cold, path = tiny()
    cache = WeightCache()
    with GGUFFile(path) as gf:
        load_weights(read_hparams(gf), gf, cold.dtype, blocks=True, cache=cache)
    assert cache.last_hit
    warm = load_muse_glimmer(path)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    assert torch.equal(cold.spec_forward(ids, all_logits_rows=True, want_hidden=False)[0],
                       warm.spec_forward(ids, all_logits_rows=True, want_hidden=False)[0])
