"""The bench's drafter per configuration: each bundled drafter shipped for the model file is
attached once, and each configuration runs with its own (head, feature taps), the target left
as it was loaded afterwards."""

from __future__ import annotations

import types

import numpy as np
import tsspec_gguf

from tsspec_bench.drafters import HeadSwitch, bundled_heads
from tsspec.hookspecs import hookimpl
from tsspec_gguf.gguf_writer import write_gguf
from tsspec_gguf.identity import identify
from tsspec.plugins import PluginHost
from tsspec.runtime.catalog import build_catalog
from tsspec.runtime.loading import LoadOptions


class FakeTarget:
    def __init__(self):
        self.draft_head = None
        self.feature_taps = None

    def spec_set_feature_taps(self, layers):
        self.feature_taps = None if layers is None else tuple(layers)


def _files(tmp_path):
    rng = np.random.default_rng(0)
    model = write_gguf(tmp_path / "m.gguf", "llama", {"llama.block_count": 1},
                       {"token_embd.weight": rng.normal(size=(16, 8)).astype(np.float32)})
    head_a = write_gguf(tmp_path / "a.gguf", "fakehead", {"fakehead.taps": 0}, {"w": np.zeros((2, 2), np.float32)})
    head_b = write_gguf(tmp_path / "b.gguf", "fakehead", {"fakehead.taps": 2}, {"w": np.ones((2, 2), np.float32)})
    return model, head_a, head_b


def _catalog(model, head_a, head_b, auto_b=True):
    ident = identify(model)
    target = {"architecture": ident.architecture, "shape_digest": ident.shape_digest, "sha256": ident.sha256}
    mod = types.ModuleType("fakeheads")

    def attach(target_obj, path, options):
        head = ("head", path)
        if path.endswith("b.gguf"):
            target_obj.spec_set_feature_taps([1, 2])
        else:
            target_obj.spec_set_feature_taps(None)
        target_obj.draft_head = head
        return head

    @hookimpl
    def tsspec_register_drafters(register):
        register(["fakehead"], attach, files=[
            {"path": str(head_a), "algorithm": "alg-a", "target": target, "auto": False},
            {"path": str(head_b), "algorithm": "alg-b", "target": target, "auto": auto_b},
        ])

    mod.tsspec_register_drafters = tsspec_register_drafters
    host = PluginHost()
    host.register(mod, "fakeheads")
    host.register(tsspec_gguf, "gguf")  # the file toolkit: target identities, file architectures
    return build_catalog(host, discover=False)


def test_each_algorithm_gets_its_bundled_head_and_taps(tmp_path):
    model, head_a, head_b = _files(tmp_path)
    target = FakeTarget()
    heads = bundled_heads(_catalog(model, head_a, head_b), target, str(model), LoadOptions())
    assert set(heads) == {"alg-a", "alg-b", "auto"}
    assert heads["alg-a"] == (("head", str(head_a)), None)
    assert heads["alg-b"] == (("head", str(head_b)), (1, 2))
    assert heads["auto"] is heads["alg-b"]  # one attach per file
    assert target.draft_head is None and target.feature_taps is None  # left as loaded

    switch = HeadSwitch(target, heads)
    switch.use("alg-b")
    assert target.draft_head == ("head", str(head_b)) and target.feature_taps == (1, 2)
    switch.use("alg-a")
    assert target.draft_head == ("head", str(head_a)) and target.feature_taps is None
    switch.use("ngram")  # no bundled drafter: the loaded state
    assert target.draft_head is None and target.feature_taps is None
    switch.use("alg-b")
    switch.restore()
    assert target.draft_head is None and target.feature_taps is None


def test_auto_without_an_auto_record_and_operator_drafters(tmp_path):
    model, head_a, head_b = _files(tmp_path)
    catalog = _catalog(model, head_a, head_b, auto_b=False)
    target = FakeTarget()
    assert set(bundled_heads(catalog, target, str(model), LoadOptions())) == {"alg-a", "alg-b"}
    # the operator's drafter serves every configuration; file-less models have no bundled ones
    assert bundled_heads(catalog, target, str(model), LoadOptions(), operator_drafter=True) == {}
    assert bundled_heads(catalog, target, None, LoadOptions()) == {}
    other = write_gguf(tmp_path / "other.gguf", "llama", {"llama.block_count": 1},
                       {"token_embd.weight": np.zeros((16, 4), np.float32)})
    assert bundled_heads(catalog, target, str(other), LoadOptions()) == {}


def test_no_switch_without_heads():
    target = FakeTarget()
    target.draft_head = "loaded"
    switch = HeadSwitch(target, {})
    switch.use("anything")
    switch.restore()
    assert target.draft_head == "loaded"
