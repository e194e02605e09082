"""The kernels plugin through the core's kernel hook: registration records, availability,
the table a loader receives, and what ``tsspec plugins`` / ``--stats`` print."""

from __future__ import annotations

import json

import pytest

import tsspec_kernels_cuda
from tsspec.cli.generate_cmd import describe_target, kernels_in_use
from tsspec.hookspecs import hookimpl
from tsspec.plugins import PluginHost
from tsspec.runtime.catalog import build_catalog
from tsspec_kernels_cuda import reference
from tsspec_kernels_cuda.loader import DeviceProbe, probe
from tsspec_kernels_cuda.sources import KERNELS


def _catalog(*plugins):
    host = PluginHost()  # a fresh manager per test, in-process plugins only
    for name, plugin in plugins:
        host.register(plugin, name)
    return build_catalog(host, discover=False)


def test_every_op_is_registered_with_the_probe_verdict():
    catalog = _catalog(("kernels_cuda", tsspec_kernels_cuda))
    found = probe()
    assert set(catalog.kernels) == set(KERNELS)
    for op, entries in catalog.kernels.items():
        (entry,) = entries
        assert entry.device == "cuda" and entry.plugin == "kernels_cuda" and entry.description
        assert entry.available == found.available
        if not found.available:
            assert entry.reason.startswith("unavailable: ") and catalog.kernel(op, "cuda") is None
    if not found.available:
        assert catalog.kernel_table("cuda") == {}


def test_probe_without_cupy_names_the_fix(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_cupy(name, *args, **kwargs):
        if name == "cupy" or name.startswith("cupy."):
            raise ImportError("No module named 'cupy'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    verdict = probe()
    assert not verdict.available and "cupy-cuda12x" in verdict.reason
    assert verdict.describe().startswith("unavailable: CuPy is not importable")
    assert DeviceProbe(True, device="NVIDIA H200", arch="compute_90").describe() == "device NVIDIA H200 (compute_90)"


class _CpuKernels:
    """A plugin registering the torch contracts for the CPU (how tests drive kernel call sites)."""

    @hookimpl
    def tsspec_register_kernels(self, register):
        register("gdn_verify", reference.gdn_verify, device="cpu", description="contract")
        register("gdn_commit", reference.gdn_commit, device="cpu", available=False, reason="switched off")


def test_kernel_table_is_per_device_and_skips_unavailable():
    catalog = _catalog(("cpu-kernels", _CpuKernels()))
    assert catalog.kernel_table("cpu") == {"gdn_verify": reference.gdn_verify}
    assert catalog.kernel("gdn_commit", "cpu") is None
    assert catalog.kernel_table("cuda") == {}


def test_bad_registration_fails_the_plugin():
    class Bad:
        @hookimpl
        def tsspec_register_kernels(self, register):
            register("gdn_verify", "not callable")

    catalog = _catalog(("bad", Bad()))
    assert catalog.kernels == {}
    assert catalog.host.plugin_info("bad").status == "failed"


def test_loader_receives_the_table(tmp_path):
    """load_model hands the loader the available ops of its device type as options.kernels."""
    import gguf

    from tsspec.runtime.loading import load_model

    path = tmp_path / "k.gguf"
    writer = gguf.GGUFWriter(str(path), "kernel-test")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    seen = {}

    class Model:
        @hookimpl
        def tsspec_register_models(self, register):
            register(["kernel-test"], lambda p, options: seen.setdefault("kernels", dict(options.kernels)))

    catalog = _catalog(("cpu-kernels", _CpuKernels()), ("model", Model()))
    load_model(path, device="cpu", catalog=catalog)
    assert seen["kernels"] == {"gdn_verify": reference.gdn_verify}


def test_plugins_command_shows_kernels(capsys):
    from tsspec.cli.app import main

    with pytest.raises(SystemExit) as exit_info:
        main(["plugins"])
    out = capsys.readouterr().out
    assert exit_info.value.code in (0, None)
    line = next(l for l in out.splitlines() if l.strip().startswith("kernels cuda:"))
    assert "gdn_verify" in line and ("unavailable: " in line or "device " in line)
    with pytest.raises(SystemExit):
        main(["plugins", "--json"])
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert {k["op"] for k in rows["kernels_cuda"]["kernels"]} == set(KERNELS)


def test_stats_line_names_kernels_in_use():
    class Head:
        kernels_in_use = ("selector_lattice", "gdn_commit")

    class Target:
        device = "cuda:0"
        kernels_in_use = ("gdn_verify", "gdn_commit")
        draft_head = Head()

    assert kernels_in_use(Target()) == ["gdn_verify", "gdn_commit", "selector_lattice"]
    assert describe_target(Target()).endswith("device kernels gdn_verify, gdn_commit, selector_lattice")
