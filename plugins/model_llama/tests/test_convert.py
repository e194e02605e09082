"""The llama converter behind ``tsspec convert``: a HF checkpoint directory in, a GGUF the plugin
loads out, with transformers' logits (f32) and close ones (q8_0)."""

from __future__ import annotations

import json

import pytest
import torch

from .conftest import make_hf_llama


def _checkpoint(tmp_path, model):
    from safetensors.torch import save_file

    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(model.config.to_dict()))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
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
    host = PluginHost()
    host.register(tsspec_model_llama, "llama")
    catalog = build_catalog(host, discover=False)
    out = tmp_path / f"out-{outtype}.gguf"
    assert convert_checkpoint(catalog, src, out, outtype=outtype)[0] == "llama"
    target = load_model(out, catalog=catalog)
    ids = [5, 17, 3, 250, 9, 9, 41]
    logits, _ = target.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    assert ((logits - ref).abs().max() / ref.abs().max()).item() < tol
