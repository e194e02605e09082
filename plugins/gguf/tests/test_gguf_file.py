"""GGUFFile: metadata and tensors read back as written; every bad file is one ModelLoadError."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from gguf import GGUFReader, GGUFValueType, GGMLQuantizationType as T
from hypothesis import HealthCheck, given, settings, strategies as st

from tsspec.errors import ModelLoadError
from tsspec_gguf.gguf_file import GGUFFile, read_architecture
from tsspec_gguf.gguf_writer import write_gguf

METADATA = {
    "demo.block_count": 3,
    "demo.rope.freq_base": 10000.0,
    "demo.flag": True,
    "demo.negative": -7,
    "demo.big": 2**40,
    "demo.name": "héllo wörld",
    "demo.ints": [1, 2, 3],
    "demo.floats": [0.5, -1.25],
    "demo.words": ["a", "", "ünï"],
    "demo.pinned": (5, GGUFValueType.UINT8),
}


@pytest.fixture
def small_gguf(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "w.f32": rng.normal(size=(4, 32)).astype(np.float32),
        "w.f16": rng.normal(size=(2, 3, 32)).astype(np.float16),
        "w.q8": (rng.normal(size=(3, 64)).astype(np.float32), T.Q8_0),
        "norm": rng.normal(size=(32,)).astype(np.float32),
    }
    path = write_gguf(tmp_path / "small.gguf", "demo", METADATA, tensors)
    return path, tensors


def test_metadata_round_trip(small_gguf):
    path, _ = small_gguf
    gf = GGUFFile(path)
    assert gf.architecture == "demo" and read_architecture(path) == "demo"
    assert gf.arch_key("block_count") == "demo.block_count"
    assert gf.require("demo.block_count", int) == 3
    assert gf.get("demo.rope.freq_base") == 10000.0
    assert gf.get("demo.flag") is True
    assert gf.get("demo.negative") == -7 and gf.get("demo.big") == 2**40
    assert gf.get("demo.name") == "héllo wörld"
    assert gf.get("demo.ints") == [1, 2, 3]
    assert gf.get("demo.floats") == [0.5, -1.25]
    assert gf.get("demo.words") == ["a", "", "ünï"]
    assert gf.get("demo.pinned") == 5
    assert gf.get("absent", None) is None and gf.get("absent", 4) == 4
    assert "demo.flag" in gf and "absent" not in gf
    assert gf.get_array("demo.ints").dtype == np.int32


def test_metadata_matches_gguf_reader(small_gguf):
    path, _ = small_gguf
    gf, reader = GGUFFile(path), GGUFReader(path)
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            assert gf.get(key) == field.contents(), key
    assert gf.tensor_names == [t.name for t in reader.tensors]
    for t in reader.tensors:
        assert gf.tensor_shape(t.name) == tuple(int(d) for d in reversed(t.shape.tolist()))


def test_missing_key_and_wrong_kind_name_the_key(small_gguf):
    gf = GGUFFile(small_gguf[0])
    with pytest.raises(ModelLoadError, match="missing metadata key 'nope'"):
        gf.require("nope")
    with pytest.raises(ModelLoadError, match="missing metadata key 'nope'"):
        gf.get("nope")
    with pytest.raises(ModelLoadError, match="'demo.name' should be an integer"):
        gf.require("demo.name", int)
    with pytest.raises(ModelLoadError, match="should be a boolean"):
        gf.require("demo.block_count", bool)
    assert gf.require("demo.block_count", float) == 3  # an int is a number


def test_tensors_read_back(small_gguf):
    path, tensors = small_gguf
    gf = GGUFFile(path)
    assert torch.equal(gf.tensor("w.f32"), torch.from_numpy(tensors["w.f32"]))
    assert gf.tensor("w.f16").dtype == torch.float32
    assert torch.equal(gf.tensor("w.f16", torch.float16), torch.from_numpy(tensors["w.f16"]))
    assert gf.tensor_shape("w.f16") == (2, 3, 32)
    q = gf.tensor("w.q8")
    assert q.shape == (3, 64)
    assert torch.allclose(q, torch.from_numpy(tensors["w.q8"][0]), atol=0.05)
    assert gf.has_tensor("norm") and not gf.has_tensor("nope")
    assert gf.require_tensor("norm", (32,)).shape == (32,)


def test_missing_tensor_and_wrong_shape(small_gguf):
    path, _ = small_gguf
    gf = GGUFFile(path)
    with pytest.raises(ModelLoadError, match="missing tensor 'blk.9.x'") as info:
        gf.tensor("blk.9.x")
    assert info.value.path == str(path)
    with pytest.raises(ModelLoadError, match=r"tensor 'w.f32' has shape \[4, 32\], expected \[32, 4\]"):
        gf.require_tensor("w.f32", (32, 4))


def _one_line_error(path) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as info:
        GGUFFile(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    return info.value


def test_missing_empty_and_foreign_files(tmp_path):
    assert "no such file" in _one_line_error(tmp_path / "absent.gguf").problem
    (tmp_path / "empty.gguf").write_bytes(b"")
    assert "empty" in _one_line_error(tmp_path / "empty.gguf").problem
    (tmp_path / "text.gguf").write_text("hello, this is not a model\n")
    assert "not a GGUF" in _one_line_error(tmp_path / "text.gguf").problem
    assert "not a regular file" in _one_line_error(tmp_path).problem


def test_every_truncation_is_a_clean_error(small_gguf, tmp_path):
    data = open(small_gguf[0], "rb").read()
    whole = GGUFFile(small_gguf[0])
    data_end = max(whole.tensor_info(n).offset + whole.tensor_info(n).n_bytes for n in whole.tensor_names)
    cut = tmp_path / "cut.gguf"
    header_end = min(whole.tensor_info(n).offset for n in whole.tensor_names)
    # every cut inside the header, then every 5th byte of the tensor data
    for length in [*range(0, header_end + 1), *range(header_end + 1, data_end, 5)]:
        cut.write_bytes(data[:length])
        try:
            gf = GGUFFile(cut)
        except ModelLoadError:
            continue
        pytest.fail(f"truncation at {length} of {data_end} opened without error: {gf!r}")


def _header_with(counts: tuple[int, int], body: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, *counts) + body


@pytest.mark.parametrize(
    "raw, expected",
    [
        (_header_with((0, 2**62)), "metadata entries cannot fit"),
        (_header_with((2**62, 0)), "tensors cannot fit"),
        (b"GGUF" + struct.pack("<I", 7) + bytes(16), "unsupported GGUF version 7"),
        (b"GGUF" + struct.pack(">I", 3) + bytes(16), "big-endian"),
        # one key whose string length is absurd
        (_header_with((0, 1), struct.pack("<Q", 2**63) + b"k"), "metadata key needs"),
        # one key holding an array of 2**60 uint8 items
        (_header_with((0, 1), struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 0, 2**60)), "array 'k'"),
        # an array of 2**60 strings
        (_header_with((0, 1), struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 8, 2**60)), "array 'k'"),
        # an unknown value type
        (_header_with((0, 1), struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99)), "unknown value type 99"),
        # a tensor with 9 dimensions
        (_header_with((1, 0), struct.pack("<Q", 1) + b"t" + struct.pack("<I", 9)), "9 dimensions"),
        # a tensor with an unknown type
        (_header_with((1, 0), struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 32, 999, 0)), "unknown ggml type"),
        # a tensor whose data offset is past the end of the file
        (_header_with((1, 0), struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 32, 0, 2**40)), "past the end"),
        # a tensor of 2**40 float32 weights in a tiny file
        (_header_with((1, 0), struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 2**40, 0, 0)), "truncated"),
        # a Q4_0 row of 33 weights (not a whole block)
        (_header_with((1, 0), struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 33, 2, 0)), "block size"),
    ],
)
def test_corrupted_headers(tmp_path, raw, expected):
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw + bytes(64))
    assert expected in _one_line_error(path).problem


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_header_corruption_never_escapes(small_gguf, tmp_path_factory, data):
    raw = bytearray(open(small_gguf[0], "rb").read())
    gf = GGUFFile(small_gguf[0])
    header_end = min(info.offset for info in (gf.tensor_info(n) for n in gf.tensor_names))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, header_end - 1))
        raw[position] = data.draw(st.integers(0, 255))
    path = tmp_path_factory.mktemp("corrupt") / "c.gguf"
    path.write_bytes(bytes(raw))
    try:
        damaged = GGUFFile(path)
        for name in damaged.tensor_names:
            damaged.tensor(name)
    except ModelLoadError as exc:
        assert "\n" not in str(exc)


def test_memory_source_reads_like_a_file():
    from tsspec_gguf.gguf_file import MemorySource

    src = MemorySource("demo", {"demo.block_count": 3, "demo.ids": np.arange(3)}, {"w": np.ones((2, 4), np.float32)})
    assert src.architecture == "demo" and src.require(src.arch_key("block_count")) == 3
    assert src.get("demo.ids") == [0, 1, 2] and src.get("absent", None) is None
    assert src.tensor_names == ["w"] and src.tensor_shape("w") == (2, 4)
    assert src.require_tensor("w", (2, 4), torch.float64).dtype == torch.float64
    for call in (lambda: src.get("absent"), lambda: src.tensor("v"), lambda: src.require_tensor("w", (4, 2))):
        with pytest.raises(ModelLoadError, match="<memory>"):
            call()
