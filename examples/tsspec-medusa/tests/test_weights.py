"""The Medusa GGUF: writer -> reader round trip, and one-line errors for bad files."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tsspec_medusa import (
    MedusaFileError,
    ARCHITECTURE,
    read_medusa,
    read_medusa_info,
    write_medusa,
    write_random_medusa,
)

K, L, H, V = 3, 2, 8, 24


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(K, L, H, H, generator=g), torch.randn(K, L, H, generator=g), torch.randn(K, V, H, generator=g)


def test_round_trip_is_exact_in_f32(tmp_path):
    res_w, res_b, out = weights()
    path = write_medusa(tmp_path / "m.gguf", res_w, res_b, out, name="unit")
    info = read_medusa_info(path)
    assert (info.head_count, info.layers_per_head, info.hidden_size, info.vocab_size) == (K, L, H, V)
    assert info.name == "unit" and info.path == str(path)
    heads = read_medusa(path)
    assert torch.equal(heads.res_weight, res_w)
    assert torch.equal(heads.res_bias, res_b)
    assert torch.equal(heads.out_weight, out)


def test_f16_round_trip_is_close(tmp_path):
    res_w, res_b, out = weights(1)
    heads = read_medusa(write_medusa(tmp_path / "m16.gguf", res_w, res_b, out, float16=True))
    torch.testing.assert_close(heads.out_weight, out, rtol=1e-3, atol=1e-3)
    assert torch.equal(heads.res_bias, res_b)  # biases stay F32


def test_random_writer_is_seeded(tmp_path):
    a = read_medusa(write_random_medusa(tmp_path / "a.gguf", H, V, heads=2, seed=5))
    b = read_medusa(write_random_medusa(tmp_path / "b.gguf", H, V, heads=2, seed=5))
    c = read_medusa(write_random_medusa(tmp_path / "c.gguf", H, V, heads=2, seed=6))
    assert torch.equal(a.out_weight, b.out_weight) and not torch.equal(a.out_weight, c.out_weight)
    assert (a.head_count, a.layers_per_head, a.hidden_size, a.vocab_size) == (2, 1, H, V)
    with pytest.raises(ValueError):
        write_random_medusa(tmp_path / "d.gguf", 0, V)


def _write_raw(path, arch=ARCHITECTURE, keys=None, tensors=None):
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (keys or {}).items():
        writer.add_uint32(key, value)
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


GOOD_KEYS = {"medusa.head_count": 1, "medusa.layers_per_head": 1, "medusa.embedding_length": H, "medusa.vocab_size": V}
GOOD_TENSORS = {
    "medusa.0.res.0.weight": np.zeros((H, H), np.float32),
    "medusa.0.res.0.bias": np.zeros(H, np.float32),
    "medusa.0.out.weight": np.zeros((V, H), np.float32),
}


def test_hand_written_file_in_the_documented_layout_reads(tmp_path):
    heads = read_medusa(_write_raw(tmp_path / "ok.gguf", keys=GOOD_KEYS, tensors=GOOD_TENSORS))
    assert heads.head_count == 1 and heads.vocab_size == V


@pytest.mark.parametrize(
    "arch,keys,tensors,problem",
    [
        ("llama", GOOD_KEYS, GOOD_TENSORS, "not a Medusa heads file"),
        (ARCHITECTURE, {k: v for k, v in GOOD_KEYS.items() if k != "medusa.vocab_size"}, GOOD_TENSORS, "medusa.vocab_size"),
        (ARCHITECTURE, {**GOOD_KEYS, "medusa.head_count": 0}, GOOD_TENSORS, "must be >= 1"),
        (ARCHITECTURE, GOOD_KEYS, {k: v for k, v in GOOD_TENSORS.items() if "out" not in k}, "medusa.0.out.weight"),
        (ARCHITECTURE, GOOD_KEYS, {**GOOD_TENSORS, "medusa.0.res.0.weight": np.zeros((H, H + 1), np.float32)}, "shape"),
    ],
)
def test_bad_files_are_one_line_load_errors(tmp_path, arch, keys, tensors, problem):
    path = _write_raw(tmp_path / "bad.gguf", arch, keys, tensors)
    with pytest.raises(MedusaFileError, match=problem) as info:
        read_medusa_info(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_not_a_gguf_at_all(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(MedusaFileError, match="not a readable GGUF"):
        read_medusa(junk)
