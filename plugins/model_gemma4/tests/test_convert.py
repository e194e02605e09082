"""HF checkpoint directories -> GGUF through ``tsspec convert`` (the class names pick these
converters), the file's keys, and a Q8_0 file's verify rows equal to its decode rows."""

from __future__ import annotations

import pytest
import torch

from tsspec_gguf.gguf_file import GGUFFile
from tsspec_model_gemma4.loader import load_gemma4

TOKENS = [3, 9, 27, 81, 115, 89, 11, 33, 99, 41]


def _convert(src, out, *extra):
    from tsspec.cli.app import main

    try:
        main(["convert", str(src), str(out), *extra])
    except SystemExit as exc:
        assert not exc.code


@pytest.mark.parametrize("name,arch", [("trunk", "gemma4"), ("ordered", "gemma4-assistant")])
def test_tsspec_convert_reads_a_saved_checkpoint(files, tmp_path, name, arch):
    model, path = files[name]
    model.save_pretrained(tmp_path / "hf")
    _convert(tmp_path / "hf", tmp_path / "out.gguf")
    with GGUFFile(tmp_path / "out.gguf") as converted, GGUFFile(path) as direct:
        assert converted.architecture == arch
        assert set(converted.tensor_names) == set(direct.tensor_names)
        for tensor in direct.tensor_names:
            assert torch.equal(converted.tensor(tensor), direct.tensor(tensor)), tensor
    if arch == "gemma4":
        with GGUFFile(path) as gf:
            assert gf.get("gemma4.attention.key_length") == 64 and gf.get("gemma4.attention.key_length_swa") == 32
            assert gf.get("gemma4.attention.shared_kv_layers") == 2
            assert gf.get("gemma4.feed_forward_length") == [96, 96, 96, 96, 96, 192, 192]  # double-wide shared
            assert not gf.has_tensor("blk.5.attn_k.weight") and not gf.has_tensor("blk.2.attn_v.weight")


def test_a_q8_0_file_verifies_as_it_decodes(files, tmp_path):
    model, path = files["trunk"]
    model.save_pretrained(tmp_path / "hf")
    _convert(tmp_path / "hf", tmp_path / "q8.gguf", "--outtype", "q8_0")
    decode, verify, dense = load_gemma4(tmp_path / "q8.gguf"), load_gemma4(tmp_path / "q8.gguf"), load_gemma4(path)
    for target in (decode, verify):
        target.spec_forward(TOKENS[:3], all_logits_rows=False, want_hidden=False)
    one = torch.cat([decode.spec_forward([t], all_logits_rows=True, want_hidden=False)[0] for t in TOKENS[3:]])
    many = verify.spec_forward(TOKENS[3:], all_logits_rows=True, want_hidden=False)[0]
    assert torch.equal(one, many)
    full = dense.spec_forward(TOKENS, all_logits_rows=True, want_hidden=False)[0][3:]
    # wiring check: Q8_0 error through 7 random layers stays well under what a wrong mapping gives
    assert float((many - full).abs().max() / full.abs().max()) < 0.25
