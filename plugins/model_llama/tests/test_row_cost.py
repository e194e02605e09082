"""The forward's cost by rows is measured by the target on this machine, not a constant from
another: measured once, cached per file and machine, and left out where it is not measured."""

from __future__ import annotations

from tsspec_model_llama import row_cost


def test_measure_takes_medians_per_row_count_with_a_fake_clock():
    ticks = iter(range(10_000))
    calls = []

    def forward(n):
        calls.append(n)

    profile = row_cost.measure(forward, rows=(1, 2, 4), reps=3, clock=lambda: next(ticks) * 0.001)
    assert [r for r, _ in profile] == [1, 2, 4] and all(ms == 1.0 for _, ms in profile)
    assert calls == [1, 2, 4] + [1, 2, 4] + [4, 2, 1] + [1, 2, 4]  # warm-up, then alternating order


def test_profile_is_cached_per_file_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("TSSPEC_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    calls = []
    first = row_cost.cached(str(model), "tag", lambda n: calls.append(n))
    assert calls and [r for r, _ in first] == list(row_cost.ROWS)
    calls.clear()
    assert row_cost.cached(str(model), "tag", lambda n: calls.append(n)) == first and calls == []
    row_cost.cached(str(model), "other-layout", lambda n: calls.append(n))
    assert calls  # another key measures again
    monkeypatch.setattr(row_cost, "machine_key", lambda: "another machine")
    calls.clear()
    row_cost.cached(str(model), "tag", lambda n: calls.append(n))
    assert calls


def test_embedded_target_measures_its_own_block_path(embedded_target):
    target = embedded_target
    if not (target.block_weights and target._kernels is not None):
        assert target.spec_verify_row_ms is None
        return
    before = target.cache_seq_len
    profile = target.spec_verify_row_ms
    assert [r for r, _ in profile] == list(row_cost.ROWS) and all(ms > 0 for _, ms in profile)
    assert target.cache_seq_len == before  # the calibration rows were dropped again
    assert target.spec_verify_row_ms is profile  # measured once


def test_profile_is_measured_again_for_another_kernel_build(tmp_path, monkeypatch):
    """A rebuilt kernel costs differently: its profile is not read from an older build's."""
    monkeypatch.setenv("TSSPEC_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    calls = []
    row_cost.cached(str(model), "tag", lambda n: calls.append(n))
    calls.clear()
    monkeypatch.setattr(row_cost, "kernel_build", lambda: "a rebuilt kernel")
    row_cost.cached(str(model), "tag", lambda n: calls.append(n))
    assert calls
