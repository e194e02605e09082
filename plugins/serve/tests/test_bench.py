"""``tsspec bench-serve``'s per-stream section: one stream through the HTTP server against
``generate``, paired, on the same prompts (the figures themselves live in the docs)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "spec"])
def test_per_stream_pairs_the_server_with_generate(embedded_target, mode):
    import tsspec_ngram
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec_serve.bench import _Bench

    registry = SpeculatorRegistry()
    tsspec_ngram.tsspec_register_speculators(registry.register)
    result = _Bench(embedded_target, registry, 64.0).per_stream(mode, 2, 8)
    assert len(result["pairs"]) == 2
    for pair in result["pairs"]:
        assert pair["tokens"] == 8 and pair["server"] > 0 and pair["generate"] > 0
    assert result["ratio_low"] <= result["ratio"] <= result["ratio_high"]


def test_bench_serve_refuses_an_unknown_section(capsys):
    from tsspec.cli.app import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench-serve", "--only", "nothing"])
    assert exit_.value.code == 2 and "per-stream" in capsys.readouterr().err
