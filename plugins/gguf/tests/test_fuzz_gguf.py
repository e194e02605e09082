"""Model-file fuzzing: malformed GGUFs get a one-line ModelLoadError naming the file, never a
crash, a hang or an allocation sized by a count the file claims.

The seed is a small valid llama GGUF (one layer, mixed F32 / F16 / Q8_0 / Q4_0 tensors, a
SentencePiece vocabulary). A map of its header (the offset of every count, length, type, dim and
offset field) lets the mutations hit exactly the fields a corrupt or hostile file would get
wrong: truncations, flipped bytes in the header and metadata, absurd tensor counts, shapes,
offsets and string lengths, wrong value and tensor types. Each case is opened with ``GGUFFile``
and every key and tensor is read (the raw reader: nothing wraps its exceptions), then loaded with
``load_model`` through the installed ``llama`` plugin.

Per case: only ``ModelLoadError`` may escape, its message is one line that starts with the
path; a SIGALRM bound turns a hang into a failure; tracemalloc bounds what parsing allocates.

Longer offline run (hypothesis, no deadline; minutes to hours)::

    TSSPEC_FUZZ_EXAMPLES=20000 python -m pytest tests/test_fuzz_gguf.py -q -k hypothesis
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch  # noqa: F401  (first import of torch takes seconds: not inside a case)
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tsspec_gguf.dequant  # noqa: F401  (imported here, not inside a time-bounded case)
from tsspec.errors import ModelLoadError
from tsspec_gguf.gguf_file import GGUFFile
from tsspec_gguf.gguf_writer import write_gguf

# -- the seed file -----------------------------------------------------------------------------

VOCAB, HIDDEN, FFN, HEADS, KV_HEADS, CONTEXT = 64, 32, 64, 2, 1, 128
HEAD_DIM = HIDDEN // HEADS
CASE_TIME_BOUND_S = 10  # per case; a parse of this file takes milliseconds
PARSE_ALLOC_SLACK = 1 << 20  # bytes allowed over the file's size while parsing the header
EXAMPLES = int(os.environ.get("TSSPEC_FUZZ_EXAMPLES", "0") or 0)  # 0: the fast make-test budget
FAST_EXAMPLES_RAW = 120
FAST_EXAMPLES_LOAD = 40


def _tokens() -> list[str]:
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(16)]
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces += ["\u2581"] + list(letters[:20]) + ["\u2581" + c for c in letters[:VOCAB - len(pieces) - 21]]
    assert len(pieces) == VOCAB
    return pieces


def seed_metadata(arch: str = "llama") -> dict:
    return {
        f"{arch}.block_count": 1,
        f"{arch}.embedding_length": HIDDEN,
        f"{arch}.feed_forward_length": FFN,
        f"{arch}.attention.head_count": HEADS,
        f"{arch}.attention.head_count_kv": KV_HEADS,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.context_length": CONTEXT,
        "general.name": "tsspec fuzz seed",
    }


def seed_tokenizer() -> dict:
    tokens = _tokens()
    types = [2, 3, 3] + [6] * 16 + [1] * (VOCAB - 19)  # unknown, control x2, byte x16, normal
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [float(-i) for i in range(VOCAB)],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def seed_tensors(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.normal(size=shape) * 0.1).astype(np.float32)

    kv = KV_HEADS * HEAD_DIM
    return {
        "token_embd.weight": (w(VOCAB, HIDDEN), T.Q8_0),
        "output_norm.weight": np.ones(HIDDEN, dtype=np.float32),
        "output.weight": w(VOCAB, HIDDEN).astype(np.float16),
        "blk.0.attn_norm.weight": np.ones(HIDDEN, dtype=np.float32),
        "blk.0.attn_q.weight": (w(HIDDEN, HIDDEN), T.Q4_0),
        "blk.0.attn_k.weight": w(kv, HIDDEN),
        "blk.0.attn_v.weight": w(kv, HIDDEN).astype(np.float16),
        "blk.0.attn_output.weight": (w(HIDDEN, HIDDEN), T.Q8_0),
        "blk.0.ffn_norm.weight": np.ones(HIDDEN, dtype=np.float32),
        "blk.0.ffn_gate.weight": (w(FFN, HIDDEN), T.Q8_0),
        "blk.0.ffn_up.weight": w(FFN, HIDDEN),
        "blk.0.ffn_down.weight": (w(HIDDEN, FFN), T.Q4_0),
    }


def write_seed(path, *, arch="llama", drop=(), metadata=None, tensors=None, tokenizer=True) -> str:
    meta = {**seed_metadata(arch), **(metadata or {})}
    tens = {k: v for k, v in (tensors or seed_tensors()).items() if k not in drop}
    meta = {k: v for k, v in meta.items() if k not in drop}
    return write_gguf(path, arch, meta, tens, tokenizer=seed_tokenizer() if tokenizer else None)


# -- a map of the header: where each field of the seed lives -----------------------------------


@attrs.frozen
class Field:
    offset: int
    size: int  # bytes
    kind: str  # magic, version, tensor_count, kv_count, key_len, value_type, str_len, ...
    label: str  # which key / tensor it belongs to


_SCALAR_SIZES = {VT.UINT8: 1, VT.INT8: 1, VT.UINT16: 2, VT.INT16: 2, VT.UINT32: 4, VT.INT32: 4,
                 VT.FLOAT32: 4, VT.BOOL: 1, VT.UINT64: 8, VT.INT64: 8, VT.FLOAT64: 8}


def header_map(data: bytes) -> tuple[list[Field], int]:
    """Every structural field of a (valid) GGUF header, and the offset where the header ends.
    Only the seed is walked: this is a ruler for the mutations, not a second parser."""
    fields: list[Field] = []
    pos = 0

    def take(size: int, kind: str, label: str = "") -> int:
        nonlocal pos
        fields.append(Field(pos, size, kind, label))
        value = int.from_bytes(data[pos : pos + size], "little")
        pos += size
        return value

    def string(kind: str, label: str) -> str:
        nonlocal pos
        n = take(8, kind, label)
        text = data[pos : pos + n].decode()
        pos += n
        return text

    def value(vtype: int, label: str) -> None:
        nonlocal pos
        if vtype == VT.STRING:
            string("str_len", label)
        elif vtype == VT.ARRAY:
            item = take(4, "array_type", label)
            count = take(8, "array_len", label)
            for _ in range(count):
                if item in (VT.STRING, VT.ARRAY):
                    value(item, label)
                else:
                    pos += _SCALAR_SIZES[VT(item)]
        else:
            take(_SCALAR_SIZES[VT(vtype)], "scalar", label)

    take(4, "magic")
    take(4, "version")
    n_tensors = take(8, "tensor_count")
    n_kv = take(8, "kv_count")
    for _ in range(n_kv):
        key = string("key_len", "")
        value(take(4, "value_type", key), key)
    for _ in range(n_tensors):
        name = string("tensor_name_len", "")
        n_dims = take(4, "n_dims", name)
        for _ in range(n_dims):
            take(8, "dim", name)
        take(4, "ggml_type", name)
        take(8, "tensor_offset", name)
    return fields, pos


# -- running one case --------------------------------------------------------------------------


class CaseTimeout(Exception):
    pass


class time_bound:
    """SIGALRM after ``seconds``: a hang in the reader becomes a failure of this case."""

    def __init__(self, seconds: float = CASE_TIME_BOUND_S):
        self.seconds = seconds

    def __enter__(self):
        def expired(signum, frame):
            raise CaseTimeout(f"case did not finish within {self.seconds} s")

        self.previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)


def assert_one_line_error(err: ModelLoadError, path) -> None:
    text = str(err)
    assert "\n" not in text and "\r" not in text, f"multi-line error: {text!r}"
    assert text.startswith(f"{path}: ") and err.path == str(path), text
    assert err.problem.strip(), "the error names no problem"


def read_everything(path) -> str | None:
    """Open with GGUFFile and read every key and tensor. Returns None when the file reads
    cleanly, else the ModelLoadError message; anything else propagates (a bug)."""
    size = os.path.getsize(path)
    tracemalloc.start()
    try:
        with time_bound():
            try:
                gf = GGUFFile(path)
            except ModelLoadError as err:
                assert_one_line_error(err, path)
                return str(err)
            finally:
                parse_peak = tracemalloc.get_traced_memory()[1]
            assert parse_peak <= size + PARSE_ALLOC_SLACK, (
                f"parsing a {size}-byte file allocated {parse_peak} bytes")
            with gf:
                try:
                    for key in gf.keys:
                        gf.get(key)
                    gf.architecture
                    for name in gf.tensor_names:
                        info = gf.tensor_info(name)
                        assert 0 <= info.offset and info.offset + info.n_bytes <= size
                        tracemalloc.reset_peak()
                        tensor = gf.tensor(name)
                        assert tensor.numel() == info.n_elements
                        # what a tensor read allocates is bounded by the bytes the file holds
                        # for it (a dequantised float32 copy plus the raw copy), never by a count
                        bound = 4 * info.n_elements + 2 * info.n_bytes + PARSE_ALLOC_SLACK
                        assert tracemalloc.get_traced_memory()[1] <= bound
                except ModelLoadError as err:
                    assert_one_line_error(err, path)
                    return str(err)
        return None
    finally:
        tracemalloc.stop()


def load_through_plugin(path, catalog, **kw) -> str | None:
    """load_model (the CLI's path). None when it loads, else the one-line error."""
    from tsspec.runtime.loading import load_model

    with time_bound():
        try:
            load_model(str(path), catalog=catalog, **kw)
        except ModelLoadError as err:
            assert_one_line_error(err, path)
            return str(err)
    return None


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seed_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf-fuzz")


@pytest.fixture(scope="module")
def seed(seed_dir):
    path = write_seed(seed_dir / "seed.gguf")
    data = Path(path).read_bytes()
    fields, header_end = header_map(data)
    return data, fields, header_end


@pytest.fixture(scope="module")
def catalog():
    """The installed plugins, as the CLI would load them (fresh host: no global state)."""
    from tsspec.plugins import PluginHost
    from tsspec.runtime.catalog import build_catalog

    return build_catalog(PluginHost())



@pytest.fixture(autouse=True)
def _no_weight_cache(_isolated_environ, monkeypatch):
    """Fuzzed files must not leave prepared-weight cache entries behind."""
    monkeypatch.setenv("TSSPEC_CACHE_DIR", "off")


@pytest.fixture
def llama_catalog(catalog):
    if "llama" not in catalog.models:
        pytest.skip("no installed plugin serves llama files")
    return catalog


def mutate(data: bytes, offset: int, raw: bytes) -> bytes:
    return data[:offset] + raw + data[offset + len(raw):]


def set_field(data: bytes, field: Field, value: int) -> bytes:
    return mutate(data, field.offset, (value % (1 << (8 * field.size))).to_bytes(field.size, "little"))


def fields_of(fields, kind, label=None):
    return [f for f in fields if f.kind == kind and (label is None or f.label == label)]


# -- the seed itself ---------------------------------------------------------------------------


def test_seed_is_valid_and_loads(seed, seed_dir, llama_catalog):
    data, fields, header_end = seed
    path = seed_dir / "seed.gguf"
    assert read_everything(path) is None
    assert load_through_plugin(path, llama_catalog) is None
    kinds = {f.kind for f in fields}
    assert {"tensor_count", "kv_count", "key_len", "str_len", "array_len", "dim", "ggml_type",
            "tensor_offset", "n_dims", "value_type"} <= kinds
    assert header_end < len(data)


# -- structured cases: each names what must be reported ---------------------------------------

U64_MAX = (1 << 64) - 1


def _structured_cases(data: bytes, fields: list[Field]) -> dict[str, tuple[bytes, str]]:
    """name -> (mutated bytes, a phrase the error must contain)."""
    first = lambda kind, label=None: fields_of(fields, kind, label)[0]  # noqa: E731
    tokens_len = first("array_len", "tokenizer.ggml.tokens")
    scores_len = first("array_len", "tokenizer.ggml.scores")
    embd = "token_embd.weight"
    f32_tensor = "blk.0.attn_k.weight"
    cases = {
        "empty file": (b"", "empty"),
        "bad magic": (mutate(data, 0, b"GGUG"), "not a GGUF file"),
        "a text file": (b"this is not a model\n" * 10, "not a GGUF file"),
        "version 1": (set_field(data, first("version"), 1), "unsupported GGUF version"),
        "version 99": (set_field(data, first("version"), 99), "unsupported GGUF version"),
        "big-endian": (mutate(data, 4, struct.pack(">I", 3)), "big-endian"),
        "tensor count 2^63": (set_field(data, first("tensor_count"), 1 << 63), "cannot fit"),
        "tensor count u64 max": (set_field(data, first("tensor_count"), U64_MAX), "cannot fit"),
        "kv count 2^40": (set_field(data, first("kv_count"), 1 << 40), "cannot fit"),
        "kv count too high by one": (set_field(data, first("kv_count"), int.from_bytes(
            data[first("kv_count").offset:first("kv_count").offset + 8], "little") + 1), "header"),
        "key length 2^62": (set_field(data, first("key_len"), 1 << 62), "truncated or corrupted"),
        "key length u64 max": (set_field(data, first("key_len"), U64_MAX), "truncated or corrupted"),
        "string value length 2^60": (set_field(data, first("str_len", "general.architecture"), 1 << 60),
                                     "truncated or corrupted"),
        "vocabulary of 2^50 strings": (set_field(data, tokens_len, 1 << 50), "truncated or corrupted"),
        "score array of 2^61 floats": (set_field(data, scores_len, 1 << 61), "truncated or corrupted"),
        "unknown value type": (set_field(data, first("value_type"), 99), "unknown value type"),
        "unknown array item type": (set_field(data, first("array_type", "tokenizer.ggml.tokens"), 77),
                                    "unknown value type"),
        "0 dimensions": (set_field(data, first("n_dims", embd), 0), "dimensions"),
        "5 dimensions": (set_field(data, first("n_dims", embd), 5), "dimensions"),
        "dimension 2^40": (set_field(data, first("dim", embd), 1 << 40), "past the end"),
        "dimensions overflowing u64": (
            set_field(set_field(data, fields_of(fields, "dim", embd)[0], 1 << 40),
                      fields_of(fields, "dim", embd)[1], 1 << 40), "past the end"),
        "row not a multiple of the block": (set_field(data, first("dim", embd), 33), "block size"),
        "unknown ggml type": (set_field(data, first("ggml_type", embd), 9999), "unknown ggml type"),
        "F32 tensor typed Q4_K": (set_field(data, first("ggml_type", f32_tensor), int(T.Q4_K)),
                                  "block size"),
        "F32 tensor typed F64": (set_field(data, first("ggml_type", "blk.0.ffn_up.weight"), int(T.F64)),
                                 "past the end"),
        "tensor offset past the file": (set_field(data, first("tensor_offset", embd), 1 << 40),
                                        "past the end"),
        "tensor offset u64 max": (set_field(data, first("tensor_offset", embd), U64_MAX), "past the end"),
        "tensor offset unaligned": (set_field(data, fields_of(fields, "tensor_offset")[-1],
                                              int.from_bytes(data[fields_of(fields, "tensor_offset")[-1].offset:
                                                                  fields_of(fields, "tensor_offset")[-1].offset + 8],
                                                             "little") + 1), "aligned"),
        "tensor name length 2^63": (set_field(data, first("tensor_name_len"), 1 << 63),
                                    "truncated or corrupted"),
        "key not UTF-8": (mutate(data, first("key_len").offset + 8, b"\xff\xfe"), "UTF-8"),
    }
    return cases


def test_structured_corruptions(seed, seed_dir, catalog):
    data, fields, _ = seed
    cases = _structured_cases(data, fields)
    for i, (name, (raw, phrase)) in enumerate(sorted(cases.items())):
        path = seed_dir / f"structured-{i}.gguf"
        path.write_bytes(raw)
        message = read_everything(path)
        assert message is not None, f"{name}: read without error"
        assert phrase in message, f"{name}: {message!r} lacks {phrase!r}"
        loaded = load_through_plugin(path, catalog)
        assert loaded is not None and phrase in loaded, f"{name}: load_model said {loaded!r}"


def test_every_truncation_point_fails_cleanly(seed, seed_dir, catalog):
    """Cut the file at every field boundary of the header, inside the data and one byte short:
    all are errors (the tensor data no longer fits), none is a crash."""
    data, fields, header_end = seed
    cuts = sorted({0, 1, 3, 4, 7, header_end, header_end + 1, len(data) - 1, (header_end + len(data)) // 2}
                  | {f.offset for f in fields} | {f.offset + f.size // 2 for f in fields})
    path = seed_dir / "truncated.gguf"
    for cut in cuts:
        path.write_bytes(data[:cut])
        assert read_everything(path) is not None, f"truncated at {cut}: read without error"
    for cut in cuts[:: max(1, len(cuts) // 12)]:  # the plugin path on a sample of them
        path.write_bytes(data[:cut])
        assert load_through_plugin(path, catalog) is not None


def test_duplicates_and_alignment(seed, seed_dir):
    for name, alignment in {"zero": 0, "three": 3, "string": "32"}.items():
        path = write_seed(seed_dir / f"align-{name}.gguf", metadata={"general.alignment": alignment})
        message = read_everything(path)
        assert message is not None and "general.alignment" in message, (name, message)
    data = seed[0]
    # same-length names, so the rest of the file stays where it was
    renames = {
        "duplicate tensor": (b"blk.0.ffn_up.weight", b"blk.0.attn_k.weight"),
        "duplicate key": (b"llama.rope.freq_base", b"llama.context_length"),
    }
    for name, (old, new) in renames.items():
        assert len(old) == len(new) and data.count(old) == 1
        path = seed_dir / f"{name.replace(' ', '-')}.gguf"
        path.write_bytes(data.replace(old, new))
        message = read_everything(path)
        assert message is not None and "duplicate" in message and new.decode() in message, message


# -- semantic problems: the loader names the key or tensor -------------------------------------


def test_missing_tensor_is_named(seed_dir, llama_catalog):
    path = write_seed(seed_dir / "missing-tensor.gguf", drop=("blk.0.ffn_down.weight",))
    message = load_through_plugin(path, llama_catalog)
    assert message is not None and "blk.0.ffn_down.weight" in message and "missing" in message


def test_wrong_shape_is_named(seed_dir, llama_catalog):
    tensors = seed_tensors()
    tensors["blk.0.ffn_up.weight"] = np.zeros((FFN // 2, HIDDEN), dtype=np.float32)
    path = write_seed(seed_dir / "wrong-shape.gguf", tensors=tensors)
    message = load_through_plugin(path, llama_catalog)
    assert message is not None and "blk.0.ffn_up.weight" in message and "shape" in message


def test_missing_and_mistyped_keys_are_named(seed_dir, llama_catalog):
    path = write_seed(seed_dir / "missing-key.gguf", drop=("llama.block_count",))
    message = load_through_plugin(path, llama_catalog)
    assert message is not None and "llama.block_count" in message
    path = write_seed(seed_dir / "typed-key.gguf", metadata={"llama.embedding_length": "thirty-two"})
    message = load_through_plugin(path, llama_catalog)
    assert message is not None and "llama.embedding_length" in message
    path = write_seed(seed_dir / "no-arch.gguf", metadata={"general.architecture": (7, VT.UINT32)})
    for message in (read_everything(path), load_through_plugin(path, llama_catalog)):
        assert message is not None and "general.architecture" in message and "string" in message


def test_unserved_architecture_lists_what_is_served(seed_dir, catalog):
    path = write_seed(seed_dir / "martian.gguf", arch="martian")
    message = load_through_plugin(path, catalog)
    assert message is not None and "'martian'" in message and "served" in message


def test_dflash_file_given_as_a_model(seed_dir, catalog):
    if "dflash" not in catalog.drafters:
        pytest.skip("no installed plugin serves dflash drafters")
    path = write_gguf(seed_dir / "drafter.gguf", "dflash", {"dflash.block_size": 16},
                      {"fc.weight": np.zeros((HIDDEN, HIDDEN), dtype=np.float32)})
    message = load_through_plugin(path, catalog)
    assert message is not None and "drafter" in message and "--draft-model" in message


def test_model_given_as_a_drafter(seed, seed_dir, llama_catalog):
    path = seed_dir / "seed.gguf"
    message = load_through_plugin(path, llama_catalog, draft_model=str(path))
    assert message is not None and "'llama' model, not a drafter" in message
    # and a corrupt drafter file is reported against the drafter's path, not the model's
    bad = seed_dir / "bad-drafter.gguf"
    bad.write_bytes(seed[0][:100])
    from tsspec.runtime.loading import load_model

    with time_bound(), pytest.raises(ModelLoadError) as info:
        load_model("toy", draft_model=str(bad), catalog=llama_catalog)
    assert_one_line_error(info.value, bad)


def test_not_a_file(seed_dir, catalog):
    for path, phrase in ((seed_dir / "absent.gguf", "no such file"), (seed_dir, "directory")):
        message = load_through_plugin(path, catalog)
        assert message is not None and phrase in message


# -- hypothesis: random mutations of the header ------------------------------------------------

ABSURD = [0, 1, 2, 3, 7, 255, 256, 4096, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32,
          1 << 40, 1 << 62, 1 << 63, U64_MAX]


@st.composite
def mutations(draw, data: bytes, fields: list[Field], header_end: int):
    out = data
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["field", "field", "flip", "bytes", "truncate"]))
        if kind == "field":
            field = draw(st.sampled_from(fields))
            value = draw(st.one_of(st.sampled_from(ABSURD), st.integers(0, (1 << (8 * field.size)) - 1)))
            out = set_field(out, field, value) if field.offset + field.size <= len(out) else out
        elif kind == "flip":
            at = draw(st.integers(0, max(0, min(header_end, len(out)) - 1)))
            mask = draw(st.integers(1, 255))
            out = out[:at] + bytes([out[at] ^ mask]) + out[at + 1:] if out else out
        elif kind == "bytes":
            at = draw(st.integers(0, max(0, min(header_end, len(out)) - 1)))
            out = mutate(out, at, draw(st.binary(min_size=1, max_size=16)))[: len(out)]
        else:
            out = out[: draw(st.integers(0, len(out)))]
    return out


def _hypothesis_settings(fast: int):
    return settings(
        max_examples=EXAMPLES or fast,
        deadline=None,
        derandomize=not EXAMPLES,  # make test: the same cases every run; offline: explore
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                               HealthCheck.data_too_large],
        database=None,
    )


def test_hypothesis_raw_reader(seed, seed_dir):
    data, fields, header_end = seed
    path = seed_dir / "hyp-raw.gguf"
    outcome = {"cases": 0, "errors": 0}

    @_hypothesis_settings(FAST_EXAMPLES_RAW)
    @given(st.data())
    def run(drawn):
        raw = drawn.draw(mutations(data, fields, header_end))
        path.write_bytes(raw)
        message = read_everything(path)
        outcome["cases"] += 1
        outcome["errors"] += message is not None

    run()
    assert outcome["cases"] >= min(EXAMPLES or FAST_EXAMPLES_RAW, FAST_EXAMPLES_RAW) // 2
    assert outcome["errors"] > 0
    print(f"\n[fuzz raw] {outcome['cases']} cases, {outcome['errors']} clean ModelLoadErrors, 0 failures")


def test_hypothesis_load_model(seed, seed_dir, llama_catalog):
    data, fields, header_end = seed
    path = seed_dir / "hyp-load.gguf"
    outcome = {"cases": 0, "errors": 0}

    @_hypothesis_settings(FAST_EXAMPLES_LOAD)
    @given(st.data())
    def run(drawn):
        raw = drawn.draw(mutations(data, fields, header_end))
        path.write_bytes(raw)
        message = load_through_plugin(path, llama_catalog)
        outcome["cases"] += 1
        outcome["errors"] += message is not None

    run()
    assert outcome["errors"] > 0
    print(f"\n[fuzz load_model] {outcome['cases']} cases, {outcome['errors']} clean ModelLoadErrors, 0 failures")


# -- the CLI: exit 2, one line on stderr, no traceback unless --debug --------------------------


@pytest.fixture
def cli(monkeypatch, catalog, cli_state):
    """Run tsspec's main() in-process with the module's catalog (no re-import of plugins)."""
    from tsspec.cli import app as cli_app
    from tsspec.runtime import defaults

    monkeypatch.setattr(defaults, "configure", lambda controls=None: catalog)

    def run(*argv):
        with pytest.raises(SystemExit) as exit_info:
            cli_app.main(list(argv))
        return exit_info.value.code

    return run


def test_cli_reports_corrupt_files_in_one_line(seed, seed_dir, cli, capsys):
    data, fields, _ = seed
    cases = _structured_cases(data, fields)
    picked = ["bad magic", "vocabulary of 2^50 strings", "dimension 2^40", "unknown ggml type"]
    for i, name in enumerate(picked):
        path = seed_dir / f"cli-{i}.gguf"
        path.write_bytes(cases[name][0])
        for argv in (["generate", "--model", str(path), "-p", "hi", "-n", "2"],
                     ["inspect", str(path)],
                     ["generate", "--model", "toy", "--draft-model", str(path), "-p", "hi", "-n", "2"]):
            code = cli(*argv)
            err = capsys.readouterr().err
            assert code == 2, (name, argv, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"tsspec: error: {path}: "), (name, err)
            assert cases[name][1] in lines[0]
            assert "Traceback" not in err


def test_cli_debug_shows_the_traceback(seed, seed_dir, monkeypatch, catalog, cli_state):
    from tsspec.cli import app as cli_app
    from tsspec.runtime import defaults

    monkeypatch.setattr(defaults, "configure", lambda controls=None: catalog)
    path = seed_dir / "debug.gguf"
    path.write_bytes(seed[0][:64])
    with pytest.raises(ModelLoadError):
        cli_app.main(["--debug", "generate", "--model", str(path), "-p", "hi"])


def test_cli_subprocess_truncated_model(seed, seed_dir):
    """The real executable, plugins off (the file fails before any plugin is asked)."""
    path = seed_dir / "subprocess.gguf"
    path.write_bytes(seed[0][: len(seed[0]) // 3])
    env = {**os.environ, "TSSPEC_PLUGINS": "", "TSSPEC_CACHE_DIR": "off"}
    proc = subprocess.run(
        [sys.executable, "-c", "from tsspec.cli.app import main; main()", "generate", "--model", str(path), "-p", "hi"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tsspec: error: {path}: "), proc.stderr
    assert proc.stdout == ""
