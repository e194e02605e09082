"""The forward's cost by rows is measured by the target on this machine, not a constant from
another: measured once (tsspec_gguf.row_timing, at a realistic context), cached per file and
machine, and left out where it is not measured."""

from __future__ import annotations

import json

from tsspec_model_llama import row_cost

PROFILE = ((1, 5.0), (2, 5.5), (4, 7.0))


def _measure(calls):
    def measure():
        calls.append(1)
        return PROFILE

    return measure


def test_profile_is_cached_per_file_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("TSSPEC_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    calls = []
    first = row_cost.cached(str(model), "tag", _measure(calls))
    assert calls and first == PROFILE
    calls.clear()
    assert row_cost.cached(str(model), "tag", _measure(calls)) == first and calls == []
    row_cost.cached(str(model), "other-layout", _measure(calls))
    assert calls  # another key measures again
    monkeypatch.setattr(row_cost, "machine_key", lambda: "another machine")
    calls.clear()
    row_cost.cached(str(model), "tag", _measure(calls))
    assert calls


def test_a_profile_of_an_older_format_or_where_more_rows_cost_less_is_measured_again(tmp_path, monkeypatch):
    """Format 1's three unpaired passes left noisy profiles (1 row dearer than 2) in the cache."""
    monkeypatch.setenv("TSSPEC_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    monkeypatch.setattr(row_cost, "FORMAT", 1)
    old = row_cost._entry(str(model), "tag")
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps([[1, 9.0], [2, 9.9]]))
    monkeypatch.setattr(row_cost, "FORMAT", 2)
    calls = []
    assert row_cost.cached(str(model), "tag", _measure(calls)) == PROFILE and calls  # not read
    entry = row_cost._entry(str(model), "tag")
    entry.write_text(json.dumps([[1, 26.2], [2, 23.5], [3, 30.8]]))
    calls.clear()
    assert row_cost.cached(str(model), "tag", _measure(calls)) == PROFILE and calls  # not trusted
    assert json.loads(entry.read_text()) == [list(p) for p in PROFILE]  # and replaced


def test_embedded_target_measures_its_own_block_path(embedded_target):
    target = embedded_target
    if not (target.block_weights and target._kernels is not None):
        assert target.spec_verify_row_ms is None
        return
    before = target.cache_seq_len
    profile = target.spec_verify_row_ms
    assert [r for r, _ in profile] == list(row_cost.ROWS) and all(ms > 0 for _, ms in profile)
    assert all(b >= a for (_, a), (_, b) in zip(profile, profile[1:]))  # monotone
    assert target.cache_seq_len == before  # the calibration rows were dropped again
    assert target.spec_verify_row_ms is profile  # measured once


def test_embedded_target_times_its_rows_after_the_context_and_leaves_its_state(embedded_target, monkeypatch):
    target = embedded_target
    if not (target.block_weights and target._kernels is not None):
        return
    target.reset()
    target.spec_forward([1, 2, 3], all_logits_rows=False, want_hidden=False)
    target.spec_keep(3)
    last = target._last_forward
    starts = []
    real = target.spec_forward

    def spy(tokens, **kw):
        starts.append((target.cache_seq_len, len(tokens)))
        return real(tokens, **kw)

    monkeypatch.setattr(target, "spec_forward", spy)
    profile = target._measure_row_cost(40, (1, 2, 4)).profile()
    assert [r for r, _ in profile] == [1, 2, 4]
    assert starts[0] == (3, 37)  # filler from the cached tokens up to the context
    assert {s for s, _ in starts[1:]} == {40} and len(starts) == 1 + 3 * (1 + 9)  # every timed row after it
    assert target.cache_seq_len == 3 and target._last_forward == last  # spec_keep's state as it was
    target.reset()


def test_a_cached_profile_is_kept_only_where_a_quick_re_measure_agrees(tmp_path, monkeypatch):
    """A profile cached under another load is checked at load: within the quick rounds' spread
    it stays; outside it, the profile is measured again and the entry replaced."""
    monkeypatch.setenv("TSSPEC_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    calls = []
    busy = ((1, 22.0), (2, 30.0), (4, 72.3))  # measured under load: 4 rows at 3.3x one row
    row_cost.cached(str(model), "tag", lambda: busy)
    checks = []

    def check(ratios):
        return lambda: (checks.append(1), (4, ratios))[1]

    assert row_cost.cached(str(model), "tag", _measure(calls), check=check([3.2, 3.3, 3.5])) == busy and not calls
    assert row_cost.cached(str(model), "tag", _measure(calls), check=check([1.3, 1.4, 1.45])) == PROFILE and calls
    assert json.loads(row_cost._entry(str(model), "tag").read_text()) == [list(p) for p in PROFILE]
    assert len(checks) == 2


def test_the_quick_check_returns_the_widest_widths_rounds(embedded_target):
    target = embedded_target
    if not (target.block_weights and target._kernels is not None):
        return
    width, ratios = target._measure_row_cost(40, (4,), 2).samples[-1]
    assert width == 4 and len(ratios) == 2 and all(r > 0 for r in ratios)
    target.reset()


def test_profile_is_measured_again_for_another_kernel_build(tmp_path, monkeypatch):
    """A rebuilt kernel costs differently: its profile is not read from an older build's."""
    monkeypatch.setenv("TSSPEC_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    calls = []
    row_cost.cached(str(model), "tag", _measure(calls))
    calls.clear()
    monkeypatch.setattr(row_cost, "kernel_build", lambda: "a rebuilt kernel")
    row_cost.cached(str(model), "tag", _measure(calls))
    assert calls
