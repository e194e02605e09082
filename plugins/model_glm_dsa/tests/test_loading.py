"""What the loader reads: the NextN layer only when draft-head speculation is requested at load
time (``TS_MTP_SPEC`` / ``TS_MTP_TYPE`` / ``TS_MTP_DRAFT`` and their ``TS_SPEC_*`` spellings).

On a file whose NextN layer holds 96 MiB (experts 128 x 1024 x 64, float32; the trunk is a few
hundred KiB), checked from outside the loader: a trace of every tensor read from the file, the
page residency of the file's NextN range (``mincore`` after evicting the file from the page
cache), and the process's resident memory with and without the layer."""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import subprocess
import sys

import pytest
import torch

from tsspec.errors import OptionsError

MIB = 1 << 20
BIG = dict(vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=1024, num_hidden_layers=2,
           num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
           qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=128, num_experts_per_tok=2, n_shared_experts=1,
           n_group=1, topk_group=1, first_k_dense_replace=2, index_n_heads=2, index_head_dim=16, index_topk=4,
           max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
           num_nextn_predict_layers=1, tie_word_embeddings=False)


# -- the request ------------------------------------------------------------------------------------
def test_request_from_the_environment():
    from tsspec import SpeculationOptions
    from tsspec_model_glm_dsa.request import read_request

    assert read_request(None, {}).wanted
    assert read_request(None, {"TS_MTP_DRAFT": "3"}).window == 3
    off = read_request(None, {"TS_MTP_SPEC": "0"})
    assert not off.wanted and "TS_MTP_SPEC" in off.reason
    ngram = read_request(None, {"TS_MTP_TYPE": "ngram"})
    assert not ngram.wanted and "'ngram'" in ngram.reason
    assert read_request(None, {"TS_MTP_SPEC": "0", "TS_SPEC_SPEC": "1"}).wanted  # TS_SPEC_ wins
    assert not read_request(SpeculationOptions(enabled=False), {}).wanted  # the API's options
    assert read_request(SpeculationOptions(enabled=False), {"TS_MTP_SPEC": "1"}).wanted  # env over them
    with pytest.raises(OptionsError, match="TS_MTP_DRAFT"):
        read_request(None, {"TS_MTP_DRAFT": "many"})


# -- the registered loader, the decline reasons -------------------------------------------------------
@pytest.fixture(scope="module")
def small_files(converted, tmp_path_factory):
    """(with NextN, without NextN) GGUF paths of the oracle model."""
    from tsspec_model_glm_dsa.convert import write

    arch, meta, tensors = converted
    folder = tmp_path_factory.mktemp("small")
    write(folder / "with.gguf", arch, meta, tensors)
    trunk_meta = {k: v for k, v in meta.items() if not k.endswith("nextn_predict_layers")}
    trunk_meta["glm-dsa.block_count"] = meta["glm-dsa.block_count"] - 1
    write(folder / "without.gguf", arch, trunk_meta, {k: v for k, v in tensors.items() if not k.startswith("blk.4.")})
    return str(folder / "with.gguf"), str(folder / "without.gguf")


def _draft_head_row(target):
    from tsspec import SpeculationOptions
    from tsspec.runtime.defaults import default_catalog

    rows = {r["name"]: r for r in default_catalog().speculators.evaluate(target, SpeculationOptions())}
    return rows["draft-head"], rows["ngram"]


@pytest.mark.parametrize("env,loaded,words", [
    ({}, True, None),
    ({"TS_MTP_SPEC": "0"}, False, "TS_MTP_SPEC"),
    ({"TS_SPEC_TYPE": "ngram"}, False, "'ngram'"),
])
def test_loader_reads_the_request_at_load_time(small_files, monkeypatch, env, loaded, words):
    import tsspec

    for name in ("TS_MTP_SPEC", "TS_SPEC_SPEC", "TS_MTP_TYPE", "TS_SPEC_TYPE", "TS_MTP_DRAFT", "TS_SPEC_DRAFT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    target = tsspec.load_model(small_files[0])
    assert (target.draft_head is not None) == loaded
    head_row, ngram_row = _draft_head_row(target)
    assert ngram_row["status"] == "serves"  # the trunk is drafter-independent
    if loaded:
        assert head_row["status"] == "serves"
    else:
        assert head_row["code"] == "no_draft_head"
        assert "NextN layer was not loaded" in head_row["reason"] and words in head_row["reason"]


def test_a_file_without_nextn_says_so(small_files, monkeypatch):
    import tsspec

    monkeypatch.delenv("TS_MTP_SPEC", raising=False)
    target = tsspec.load_model(small_files[1])
    assert target.draft_head is None
    head_row, ngram_row = _draft_head_row(target)
    assert head_row["code"] == "no_draft_head" and "carries no NextN layer" in head_row["reason"]
    assert ngram_row["status"] == "serves"


# -- a 96 MiB NextN layer ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    """(path, NextN bytes): a tiny dense trunk and a NextN layer of 128 experts."""
    import transformers as t
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as m

    from tsspec_model_glm_dsa.convert import convert_state_dict, write

    config = t.GlmMoeDsaConfig(**BIG)
    torch.manual_seed(0)
    model = t.GlmMoeDsaForCausalLM(config)
    layer = m.GlmMoeDsaDecoderLayer(t.GlmMoeDsaConfig(**{**BIG, "num_hidden_layers": 1, "first_k_dense_replace": 0}), 0)
    H = config.hidden_size
    sd = dict(model.state_dict())
    with torch.no_grad():
        for key, value in layer.state_dict().items():
            sd[f"model.layers.2.{key}"] = torch.randn(value.shape) * 0.05
        for key, shape in (("eh_proj.weight", (H, 2 * H)), ("enorm.weight", (H,)), ("hnorm.weight", (H,)),
                           ("shared_head.norm.weight", (H,))):
            sd[f"model.layers.2.{key}"] = torch.randn(shape) * 0.05 + (1.0 if "norm" in key else 0.0)
    arch, meta, tensors = convert_state_dict(config, sd)
    del model, layer, sd
    nextn_bytes = sum(v.nbytes for k, v in tensors.items() if k.startswith("blk.2."))
    assert nextn_bytes >= 64 * MIB
    path = tmp_path_factory.mktemp("big") / "big-nextn.gguf"
    write(path, arch, meta, tensors)
    del tensors
    gc.collect()
    return str(path), nextn_bytes


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _resident_fraction(path: str, start: int, length: int) -> float:
    """The share of pages of [start, start + length) of the file in the page cache (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        lo = start // page * page
        n = (start + length - lo + page - 1) // page
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped)) + lo
        vec = (ctypes.c_ubyte * n)()
        if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(n * page), vec) != 0:
            return 1.0  # unknown: reads as "not evicted", so no residency claim is made
        resident = sum(v & 1 for v in vec) / n
        del vec
        return resident
    finally:
        import gc as _gc

        _gc.collect()
        try:
            mapped.close()
        except BufferError:
            pass


def _nextn_range(path: str) -> tuple[int, int, int, int]:
    """(NextN start, NextN length, trunk start, trunk length) in file bytes."""
    from tsspec_gguf.gguf_file import GGUFFile

    with GGUFFile(path) as gf:
        infos = [(n, gf.tensor_info(n)) for n in gf.tensor_names]
    nextn = [i for n, i in infos if n.startswith("blk.2.")]
    trunk = [i for n, i in infos if not n.startswith("blk.2.")]
    lo, hi = min(i.offset for i in nextn), max(i.offset + i.n_bytes for i in nextn)
    tlo, thi = min(i.offset for i in trunk), max(i.offset + i.n_bytes for i in trunk)
    return lo, hi - lo, tlo, thi - tlo


def _read_ahead_bytes() -> int:
    """The largest read-ahead window of this machine's block devices (the kernel may read that
    far past a page the loader touched); 8 MiB when /sys does not say."""
    import glob

    sizes = []
    for name in glob.glob("/sys/class/bdi/*/read_ahead_kb"):
        try:
            with open(name) as handle:
                sizes.append(int(handle.read()) * 1024)
        except (OSError, ValueError):
            pass
    return max(sizes, default=8 * MIB)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc and mincore")
def _rss_growth_of_a_load(path: str, spec: str) -> int:
    """Resident bytes a fresh process gains by loading ``path`` with ``TS_MTP_SPEC=spec``."""
    code = (
        "import gc, os, sys\n"
        "from tsspec_model_glm_dsa.loader import load_glm_dsa\n"
        "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "gc.collect(); before = rss(); target = load_glm_dsa(sys.argv[1], None); gc.collect()\n"
        "print(rss() - before)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TS_SPEC_", "TS_MTP_"))}
    env["TS_MTP_SPEC"] = spec
    out = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def test_unrequested_nextn_is_never_read(big_file, monkeypatch):
    """TS_MTP_SPEC=0: no NextN tensor is read (trace), none of its pages enters the page cache
    (mincore), and resident memory is lower by about the layer's size than with the layer."""
    from tsspec_gguf import gguf_file
    from tsspec_model_glm_dsa.loader import load_glm_dsa

    path, nextn_bytes = big_file
    lo, length, tlo, tlength = _nextn_range(path)
    read: list[str] = []
    original = gguf_file.GGUFFile.tensor_bytes

    def traced(self, name):
        read.append(name)
        return original(self, name)

    monkeypatch.setattr(gguf_file.GGUFFile, "tensor_bytes", traced)
    _evict(path)
    # a file system that keeps the file cached after POSIX_FADV_DONTNEED (tmpfs) cannot show
    # residency: then the trace and the memory checks below stand alone
    evicted = _resident_fraction(path, lo, length) == 0.0
    monkeypatch.setenv("TS_MTP_SPEC", "0")
    bare = load_glm_dsa(path, None)
    assert bare.draft_head is None
    assert read and not [n for n in read if n.startswith("blk.2.")]
    if evicted:  # past the kernel's read-around after the trunk's last page, no NextN page was read
        skip = _read_ahead_bytes() + MIB
        assert length - skip >= 64 * MIB
        assert _resident_fraction(path, lo + skip, length - skip) == 0.0
        assert _resident_fraction(path, tlo, tlength) > 0.5  # the trunk was read through the same mapping

    read.clear()
    monkeypatch.setenv("TS_MTP_SPEC", "1")
    full = load_glm_dsa(path, None)
    assert full.draft_head is not None and any(n.startswith("blk.2.") for n in read)
    # resident memory in fresh processes (this one's allocator reuses what earlier tests freed)
    without, with_nextn = _rss_growth_of_a_load(path, "0"), _rss_growth_of_a_load(path, "1")
    assert without < 0.2 * nextn_bytes
    assert 0.8 * nextn_bytes < with_nextn - without < 1.5 * nextn_bytes, (without / MIB, with_nextn / MIB)
    print(f"NextN {nextn_bytes / MIB:.1f} MiB; RSS growth without {without / MIB:.1f} MiB, with {with_nextn / MIB:.1f} MiB")
    del bare, full
