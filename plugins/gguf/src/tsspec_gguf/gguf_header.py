"""A bounded parser for the GGUF header: metadata key/values and tensor descriptors.

Why not ``gguf.GGUFReader`` directly: it builds a numpy view per array element (2.8 s for the
49k-token vocabulary of the embedded model, over the whole load budget) and trusts the counts
it reads, so a corrupt array length makes it loop over empty slices without end. This parser
reads the same format (gguf-py's constants give the type tables) with one rule: every count is
checked against the bytes left in the file BEFORE anything is allocated for it.

Layout (little-endian): ``b"GGUF"``, u32 version (2 or 3), u64 tensor count, u64 key/value
count, the key/values, the tensor descriptors (name, u32 n_dims, u64 dims[n_dims] in ggml order,
u32 type, u64 offset relative to the aligned data section), padding to ``general.alignment``.
"""

from __future__ import annotations

import struct
from typing import Any

import attrs
import numpy as np
from gguf.constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
)

SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 3  # arrays of arrays of arrays; deeper is not a file anyone writes
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
STRING_HEADER_BYTES = 8
ARRAY_HEADER_BYTES = 4 + 8

# value type -> numpy little-endian dtype for scalars and scalar arrays
SCALAR_DTYPES: dict[GGUFValueType, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("<u1"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}


class HeaderError(Exception):
    """The header is malformed; the message is one operator-facing line (no path)."""


@attrs.frozen
class TensorInfo:
    """One tensor descriptor. ``shape`` is in numpy order (ggml dims reversed)."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    offset: int  # absolute offset of the data in the file


@attrs.frozen
class GGUFHeader:
    version: int
    metadata: dict[str, Any]  # scalars as python values; scalar arrays as numpy arrays
    value_types: dict[str, GGUFValueType]
    tensors: dict[str, TensorInfo]  # in file order
    data_offset: int
    alignment: int


class _Cursor:
    """A read position over a bytes-like buffer that refuses to run past its end."""

    def __init__(self, buf, size: int):
        self.buf = buf
        self.size = size
        self.pos = 0

    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.remaining():
            raise HeaderError(
                f"truncated or corrupted header: {what} needs {n} bytes at offset {self.pos}, "
                f"{self.remaining()} left"
            )

    def unpack(self, fmt: str, what: str) -> tuple:
        n = struct.calcsize(fmt)
        self.need(n, what)
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return values

    def u32(self, what: str) -> int:
        return self.unpack("<I", what)[0]

    def u64(self, what: str) -> int:
        return self.unpack("<Q", what)[0]

    def string(self, what: str) -> str:
        length = self.u64(f"length of {what}")
        self.need(length, what)
        raw = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise HeaderError(f"{what} at offset {self.pos - length} is not valid UTF-8") from None

    def array(self, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        self.need(count * dtype.itemsize, what)
        out = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += count * dtype.itemsize
        return out


def _value_type(raw: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise HeaderError(f"{what} has unknown value type {raw}") from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, key: str, depth: int = 0) -> Any:
    dtype = SCALAR_DTYPES.get(vtype)
    if dtype is not None:
        value = cur.array(dtype, 1, f"value of {key!r}")[0]
        return bool(value) if vtype == GGUFValueType.BOOL else value.item()
    if vtype == GGUFValueType.STRING:
        return cur.string(f"value of {key!r}")
    if vtype != GGUFValueType.ARRAY:
        raise HeaderError(f"metadata key {key!r} has unhandled value type {vtype.name}")
    if depth >= MAX_ARRAY_NESTING:
        raise HeaderError(f"metadata key {key!r} nests arrays deeper than {MAX_ARRAY_NESTING}")
    item_type = _value_type(cur.u32(f"array type of {key!r}"), f"array {key!r}")
    count = cur.u64(f"array length of {key!r}")
    item_dtype = SCALAR_DTYPES.get(item_type)
    if item_dtype is not None:
        values = cur.array(item_dtype, count, f"array {key!r} of {count} items")
        return values.astype(bool) if item_type == GGUFValueType.BOOL else values
    min_item = STRING_HEADER_BYTES if item_type == GGUFValueType.STRING else ARRAY_HEADER_BYTES
    cur.need(count * min_item, f"array {key!r} of {count} items")
    if item_type == GGUFValueType.STRING:
        return _read_strings(cur, count, key)
    return [_read_value(cur, item_type, key, depth + 1) for _ in range(count)]


def _read_strings(cur: _Cursor, count: int, key: str) -> list[str]:
    """The hot loop of a header (vocabularies, merges): plain struct + slicing, no numpy."""
    buf, pos, size = cur.buf, cur.pos, cur.size
    unpack = struct.Struct("<Q").unpack_from
    out: list[str] = []
    append = out.append
    for index in range(count):
        if pos + STRING_HEADER_BYTES > size:
            cur.pos = pos
            cur.need(STRING_HEADER_BYTES, f"item {index} of array {key!r}")
        (length,) = unpack(buf, pos)
        pos += STRING_HEADER_BYTES
        if length > size - pos:
            cur.pos = pos
            cur.need(length, f"item {index} of array {key!r}")
        try:
            append(str(buf[pos : pos + length], "utf-8"))
        except UnicodeDecodeError:
            raise HeaderError(f"item {index} of array {key!r} is not valid UTF-8") from None
        pos += length
    cur.pos = pos
    return out


def _read_tensor_info(cur: _Cursor, data_limit: int) -> tuple[str, GGMLQuantizationType, tuple[int, ...], int]:
    name = cur.string("tensor name")
    n_dims = cur.u32(f"dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise HeaderError(f"tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
    dims = cur.unpack(f"<{n_dims}Q", f"dimensions of tensor {name!r}")
    raw_type = cur.u32(f"type of tensor {name!r}")
    try:
        ggml_type = GGMLQuantizationType(raw_type)
    except ValueError:
        raise HeaderError(f"tensor {name!r} has unknown ggml type {raw_type}") from None
    offset = cur.u64(f"offset of tensor {name!r}")
    if offset > data_limit:
        raise HeaderError(f"tensor {name!r} has offset {offset} past the end of the file")
    return name, ggml_type, tuple(reversed(dims)), offset


def parse_header(buf, size: int) -> GGUFHeader:
    """Parse the header of a GGUF held in ``buf`` (an mmap or bytes of ``size`` bytes)."""
    cur = _Cursor(buf, size)
    if size < 4 or cur.unpack("<I", "magic")[0] != GGUF_MAGIC:
        raise HeaderError("not a GGUF file (bad magic)")
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        swapped = struct.unpack("<I", struct.pack(">I", version))[0]
        if swapped in SUPPORTED_VERSIONS:
            raise HeaderError("big-endian GGUF files are not supported")
        raise HeaderError(f"unsupported GGUF version {version} (supported: {SUPPORTED_VERSIONS})")
    tensor_count = cur.u64("tensor count")
    kv_count = cur.u64("metadata count")
    if kv_count * MIN_KV_BYTES > cur.remaining():
        raise HeaderError(f"corrupted header: {kv_count} metadata entries cannot fit in the file")
    if tensor_count * MIN_TENSOR_INFO_BYTES > cur.remaining():
        raise HeaderError(f"corrupted header: {tensor_count} tensors cannot fit in the file")

    metadata: dict[str, Any] = {}
    value_types: dict[str, GGUFValueType] = {}
    for _ in range(kv_count):
        key = cur.string("metadata key")
        vtype = _value_type(cur.u32(f"type of {key!r}"), f"metadata key {key!r}")
        if key in metadata:
            raise HeaderError(f"duplicate metadata key {key!r}")
        metadata[key] = _read_value(cur, vtype, key)
        value_types[key] = vtype

    infos = [_read_tensor_info(cur, size) for _ in range(tensor_count)]

    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise HeaderError(f"general.alignment {alignment!r} is not a positive power of two")
    data_offset = -(-cur.pos // alignment) * alignment

    tensors: dict[str, TensorInfo] = {}
    for name, ggml_type, shape, offset in infos:
        if name in tensors:
            raise HeaderError(f"duplicate tensor {name!r}")
        block, type_size = GGML_QUANT_SIZES[ggml_type]
        n_elements = int(np.prod(shape, dtype=object))
        if shape[-1] % block:
            raise HeaderError(
                f"tensor {name!r}: row length {shape[-1]} is not a multiple of the "
                f"{ggml_type.name} block size {block}"
            )
        n_bytes = n_elements // block * type_size
        start = data_offset + offset
        if offset % alignment:
            raise HeaderError(f"tensor {name!r}: offset {offset} is not aligned to {alignment}")
        if start + n_bytes > size:
            raise HeaderError(
                f"tensor {name!r} ({n_bytes} bytes at offset {start}) extends past the end of "
                f"the file ({size} bytes): truncated?"
            )
        tensors[name] = TensorInfo(name, ggml_type, shape, n_elements, n_bytes, start)
    return GGUFHeader(version, metadata, value_types, tensors, data_offset, alignment)
