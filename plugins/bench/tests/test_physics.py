"""tsspec_bench.physics: the machine's figures and a target's weights, measured at run time.

Speeds are never asserted (the machine is shared); the tests check what is counted and the
arithmetic of the floors."""

from __future__ import annotations

import pytest
import torch

from tsspec_bench import physics
from tsspec_gguf.qlinear import BlockMatrix


class _Layer:
    def __init__(self, w, norm):
        self.w, self.norm = w, norm


class _Target:
    """Two block matrices, a dense tied embedding/head, a norm, a 4-D cache and a drafter."""

    def __init__(self):
        dense = torch.zeros(64, 32)  # [vocab, hidden]
        self._embed = dense
        self._lm_head = dense  # tied: one storage
        self._layers = [_Layer(BlockMatrix.quantize_int8(torch.ones(16, 32)), torch.ones(32)) for _ in range(2)]
        self._k = torch.zeros(2, 1, 128, 8)  # [layers, kv heads, capacity, head dim]: not a weight
        self.draft_head = _Layer(torch.zeros(1000, 32), None)  # not the target's weights
        self.config = object()


def test_weight_footprint_counts_each_storage_once_and_no_cache():
    fp = physics.weight_footprint(_Target())
    block = BlockMatrix.quantize_int8(torch.ones(16, 32))
    block_bytes = sum(t.untyped_storage().nbytes() for t in (block.q, block.d, block.m))
    assert fp["bytes"] == 64 * 32 * 4 + 2 * (block_bytes + 32 * 4)
    assert fp["weights"] == 64 * 32 + 2 * 16 * 32  # the head once, each block matrix by its shape


def test_weight_footprint_of_the_embedded_model_is_its_weights_not_its_cache():
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime.loading import load_model

    target = load_model(str(embedded_model_path()))
    fp = physics.weight_footprint(target)
    cfg = target.config
    # every matrix once (the tied embedding as the head): within the norms of hidden * vocab + layers
    assert fp["weights"] > cfg.vocab_size * cfg.hidden_size
    assert fp["bytes"] < fp["weights"] * 4  # quantised blocks: well under float32
    target.spec_forward([1, 2, 3], all_logits_rows=False, want_hidden=False)
    assert physics.weight_footprint(target) == fp  # the KV cache a forward allocates is not counted


def test_machine_figures_are_positive_and_restore_the_thread_count():
    before = torch.get_num_threads()
    assert physics.read_bandwidth(1, mib=4, reps=1) > 0
    assert physics.float32_rate(1, size=64, reps=1) > 0
    assert torch.get_num_threads() == before


def test_fma_peak_is_the_kernels_probe_and_the_floor_uses_the_best_rate():
    from tsspec_gguf import native

    peak = physics.fma_peak(2, reps=1)
    if native.probes() is None or not native.kernels().info().get("simd", "").startswith("avx2"):
        assert peak is None  # no probes' build (TSSPEC_BUILD_PROBES=1) or no AVX2: the torch figure stands alone
        return
    one = physics.fma_peak(1, reps=1)
    assert peak > 0 and one > 0 and peak == pytest.approx(2 * one, rel=0.5)  # per core, times the threads
    machine = {"threads": 2, "read_bytes_per_s": 20e9, "float32_flops_1": 1e9, "float32_flops_n": 2e9,
               "fma_peak_flops_n": 100e9}
    assert physics.picture(machine, {"bytes": 100e6, "weights": 100e6})["float32_flops"] == 100e9
    without = dict(machine, fma_peak_flops_n=None)  # the probe is absent: the matmul rate is the best
    assert physics.picture(without, {"bytes": 100e6, "weights": 100e6})["float32_flops"] == 2e9


def test_int8_peak_is_the_kernels_probe_and_gives_the_int8_floors():
    from tsspec_gguf import native

    peak = physics.int8_peak(2, reps=1)
    if native.probes() is None or not str(native.info().get("simd") or "").startswith("avx2"):
        assert peak is None  # no probes' build or no AVX2: no int8 floor
        return
    one = physics.int8_peak(1, reps=1)
    assert peak > 0 and one > 0 and peak == pytest.approx(2 * one, rel=0.5)
    machine = {"threads": 2, "read_bytes_per_s": 10e9, "float32_flops_1": 50e9, "float32_flops_n": 100e9,
               "int8_peak_ops_n": 400e9}
    p = physics.picture(machine, {"bytes": 100e6, "weights": 100e6}, rows=9)
    assert p["compute_ms_k_int8"] == pytest.approx(4.5) and p["ratio_floor_int8"] == pytest.approx(1.0)
    assert p["ratio_floor"] == pytest.approx(1.8)  # the float32 floor is unchanged
    assert "ratio_floor_int8" not in physics.picture(dict(machine, int8_peak_ops_n=None), {"bytes": 1e6, "weights": 1e6})


def test_picture_floors():
    machine = {"threads": 2, "read_bytes_per_s": 20e9, "float32_flops_1": 50e9, "float32_flops_n": 100e9}
    p = physics.picture(machine, {"bytes": 100e6, "weights": 100e6}, one_row_ms=10.0, rows=9, rows_ms=30.0)
    assert p["stream_ms"] == pytest.approx(5.0) and p["stream_tps"] == pytest.approx(200.0)
    assert p["compute_ms_1"] == pytest.approx(2.0) and p["compute_ms_k"] == pytest.approx(18.0)
    assert p["ratio_floor"] == pytest.approx(18.0 / 5.0)  # 9 rows arithmetic-bound, 1 row streaming-bound
    assert p["ratio_floor_vs_measured"] == pytest.approx(1.8) and p["one_row_over_floor"] == pytest.approx(2.0)
    busy = dict(machine, float32_flops_n=40e9)  # the second core was taken: the 1-thread rate is the best
    assert physics.picture(busy, {"bytes": 100e6, "weights": 100e6})["compute_ms_k"] == pytest.approx(36.0)
    shared = dict(machine, read_bytes_per_s_1=40e9)  # one thread read faster: the floor streams at that
    assert physics.picture(shared, {"bytes": 100e6, "weights": 100e6})["stream_ms"] == pytest.approx(2.5)
    fast = dict(machine, float32_flops_n=1e12)  # enough arithmetic: both steps stream-bound
    assert physics.picture(fast, {"bytes": 100e6, "weights": 100e6})["ratio_floor"] == pytest.approx(1.0)


def test_the_report_reads_the_picture_and_llama_cpp_against_the_file_floor():
    from tsspec_bench.peers import PLAIN, PeerRecord
    from tsspec_bench.report import BenchReport, _physics_lines

    machine = {"threads": 2, "read_bytes_per_s": 20e9, "read_bytes_per_s_1": 15e9, "float32_flops_1": 50e9,
               "float32_flops_n": 100e9, "bandwidth_buffer_mib": 256, "matmul_size": 1024}
    picture = physics.picture(machine, {"bytes": 120e6, "weights": 100e6}, one_row_ms=10.0, rows=9, rows_ms=30.0)
    picture["file_bytes"] = 100e6  # 5 ms at 20 GB/s
    llama = [PeerRecord("llama.cpp", PLAIN, "c", "qa", rep, [1], tps, 1.0) for rep, tps in ((-1, 1.0), (0, 100.0), (1, 100.0))]
    report = BenchReport({}, [], [], [], [], peer_records=llama,
                         goals={"machine": machine, "physics": picture, "verify": {"context": 500}})
    text = "\n".join(_physics_lines(report))
    assert "fused multiply-add peak" not in text  # no probe figure in this machine record
    machine["fma_peak_flops_n"] = 200e9
    assert "multiply-add peak (the compiled kernels' probe" in "\n".join(_physics_lines(report))
    assert "200 GFLOP/s" in "\n".join(_physics_lines(report))
    assert "- Weights a step streams: 120.0 MB" in text and "the GGUF file's tensors: 100.0 MB" in text
    assert "15.0 GB/s on 1 thread, 20.0 GB/s on 2" in text and "at least 6.00 ms a step: at most 167 tok/s" in text
    assert "llama.cpp's plain decoding in this run: 10.00 ms a token (median), 2.00x" in text  # warm-up left out
    assert "3.00x when both forwards run at their floors" in text and "cannot reach it" in text
