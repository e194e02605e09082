"""The shipped SmolLM2 drafters: registered for the embedded model's file identity, attached by
`auto`, named by list-speculators, lossless (greedy and seeded sampling), absent on other files."""

from __future__ import annotations

import pytest
import tsspec_gguf

from tsspec_gguf.embedded import embedded_model_path
from tsspec_gguf.identity import identify
from tsspec.plugins import PluginHost
from tsspec.runtime.catalog import build_catalog
from tsspec.runtime.generation import generate
from tsspec.runtime.loading import load_model
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams

import tsspec_draft_head
import tsspec_drafters_smollm2
from tsspec_drafters_smollm2 import drafter_files


@pytest.fixture(scope="module")
def catalog():
    host = PluginHost()
    host.register(tsspec_draft_head, "draft-head")
    host.register(tsspec_drafters_smollm2, "drafters-smollm2")
    import tsspec_model_llama

    host.register(tsspec_model_llama, "llama")
    host.register(tsspec_gguf, "gguf")  # the file toolkit the core reads model files through
    return build_catalog(host, discover=False)


def test_each_shipped_drafter_is_keyed_by_the_embedded_files_identity():
    files = drafter_files()
    assert files, "no drafter file shipped (run make drafters)"
    ident = identify(embedded_model_path())
    for f in files:
        assert f["target"] == {"architecture": ident.architecture, "shape_digest": ident.shape_digest,
                               "sha256": ident.sha256}


@pytest.fixture(scope="module")
def targets(catalog):
    path = embedded_model_path()
    return (load_model(path, catalog=catalog, options=SpeculationOptions(spec_type="draft-head")),
            load_model(path, catalog=catalog, options=SpeculationOptions(enabled=False)))


def test_draft_head_attaches_the_mtp_drafter(catalog, targets):
    with_drafter, bare = targets
    from tsspec_draft_head.nextn_file import NextNFileHead

    assert isinstance(with_drafter.draft_head, NextNFileHead)
    assert with_drafter.draft_head.source.endswith("smollm2-135m-instruct-mtp.gguf")
    assert bare.draft_head is None
    assert catalog.speculators.resolve_name(with_drafter, "auto") == "draft-head"


def test_auto_follows_the_registration(catalog):
    from tsspec_drafters_smollm2 import DRAFTERS

    target = load_model(embedded_model_path(), catalog=catalog)  # --spec-type auto
    auto = DRAFTERS["smollm2-135m-instruct-mtp.gguf"][2]
    assert (getattr(target, "draft_head", None) is not None) == auto


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_k=40, seed=5)],
                         ids=["greedy", "sampled"])
def test_generation_with_the_shipped_drafter_is_lossless_and_accepts(catalog, targets, sampling):
    with_drafter, bare = targets
    tok = bare.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]),
                     add_special_tokens=False)
    plain = generate(bare, list(ids), SpeculationOptions(enabled=False), max_tokens=24, sampling=sampling)
    spec = generate(with_drafter, list(ids), SpeculationOptions(spec_type="draft-head", adaptive=False, pmin=0.0), max_tokens=24,
                    sampling=sampling, registry=catalog.speculators)
    assert spec.speculator == "draft-head"
    assert spec.tokens == plain.tokens
    assert spec.stats.draft_tokens > 0


@pytest.fixture(scope="module")
def catalog_with_ngram():
    host = PluginHost()
    import tsspec_model_llama
    import tsspec_ngram

    for module, name in ((tsspec_draft_head, "draft-head"), (tsspec_drafters_smollm2, "drafters-smollm2"),
                         (tsspec_model_llama, "llama"), (tsspec_ngram, "ngram"), (tsspec_gguf, "gguf")):
        host.register(module, name)
    return build_catalog(host, discover=False)


@pytest.fixture(scope="module")
def auto_target(catalog_with_ngram):
    # the drafter attached (as --spec-draft-model would); auto itself does not attach it
    return load_model(embedded_model_path(), catalog=catalog_with_ngram, options=SpeculationOptions(spec_type="draft-head"))


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_k=40, seed=5)],
                         ids=["greedy", "sampled"])
def test_auto_pairs_ngram_with_the_mtp_drafter_losslessly(catalog_with_ngram, auto_target, targets, sampling):
    """Attached, the shipped MTP drafter backs up ngram under auto: ngram proposes where the
    answer repeats the prompt, the drafter elsewhere; the output is plain decoding's."""
    from tsspec.runtime.pairing import BACKUP, PRIMARY

    catalog, target, (_, bare) = catalog_with_ngram, auto_target, targets
    tok = bare.tokenizer
    text = "List the steps: open the file, read the file, close the file. Repeat them exactly."
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]), add_special_tokens=False)
    plain = generate(bare, list(ids), SpeculationOptions(enabled=False), max_tokens=32, sampling=sampling)
    options = SpeculationOptions(spec_type="auto", adaptive=False, pmin=0.0)
    speculator = catalog.speculators.create(target, options)
    spec = generate(target, list(ids), options, max_tokens=32, sampling=sampling, speculator=speculator)
    assert speculator.name == "ngram+draft-head"
    assert spec.tokens == plain.tokens
    assert speculator.proposed[PRIMARY] > 0 and speculator.proposed[BACKUP] > 0


def test_auto_with_the_select_plugin_chooses_among_ngram_the_drafter_and_the_pair_losslessly(targets):
    """With the select plugin installed, auto hands ngram and the attached MTP drafter to it: the
    output is still plain decoding's, and every step was charged to one of its candidates."""
    import tsspec_model_llama
    import tsspec_ngram
    import tsspec_select

    host = PluginHost()
    for module, name in ((tsspec_draft_head, "draft-head"), (tsspec_drafters_smollm2, "drafters-smollm2"),
                         (tsspec_model_llama, "llama"), (tsspec_ngram, "ngram"), (tsspec_gguf, "gguf"),
                         (tsspec_select, "select")):
        host.register(module, name)
    catalog = build_catalog(host, discover=False)
    target = load_model(embedded_model_path(), catalog=catalog, options=SpeculationOptions(spec_type="draft-head"))
    _, bare = targets
    tok = bare.tokenizer
    text = "List the steps: open the file, read the file, close the file. Repeat them exactly."
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]), add_special_tokens=False)
    plain = generate(bare, list(ids), SpeculationOptions(enabled=False), max_tokens=32)
    options = SpeculationOptions(spec_type="auto", pmin=0.0)
    speculator = catalog.speculators.create(target, options)
    spec = generate(target, list(ids), options, max_tokens=32, speculator=speculator)
    assert speculator.name == "select" and list(speculator.members) == ["ngram", "draft-head"]
    assert spec.tokens == plain.tokens
    assert sum(speculator.steps_by.values()) > 0


def _rss_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def test_sequence_views_of_the_mtp_drafter_share_its_weights_in_memory(targets):
    # one view per served sequence: each owns a KV cache and RoPE table (~0.5 MiB), never a copy
    # of the drafter's matrices; 16 live views must not add the weights 16 times to the process
    import gc

    import torch

    head = targets[0].draft_head
    if not head.native:
        pytest.skip("the compiled kernels were not built")
    engine = head._native
    weights = sum(t.numel() * t.element_size() for w in (engine._head, engine._e_emb, engine._e_hid, *engine._layer)
                  for t in (w.q, w.d, w.m))
    rows = torch.randn(8, head.hidden_size, generator=torch.Generator().manual_seed(0))
    tokens = [100, 200, 300, 400, 500, 600, 700, 800]
    gc.collect()
    before = _rss_bytes()
    views = []
    for i in range(16):
        view = head.for_sequence()
        view.draft_catch_up_and_step(tokens, rows, 10 + i, compact=True)
        views.append(view)
    grown = _rss_bytes() - before
    assert grown < 4 * weights, f"16 views grew RSS by {grown >> 20} MiB; the drafter's weights are {weights >> 20} MiB"
    for view in views:
        view.close()


def test_list_speculators_says_what_auto_runs_and_with_which_drafter_file(capsys):
    from tsspec.cli.app import main
    from tsspec_drafters_smollm2 import DRAFTERS

    mtp = "smollm2-135m-instruct-mtp.gguf"
    for extra in ([], ["--draft-model", str(tsspec_drafters_smollm2.HERE / mtp)]):
        try:
            main(["list-speculators", "--model", str(embedded_model_path()), *extra])
        except SystemExit as exc:
            assert not exc.code
        line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("auto -> ")][-1]
        if DRAFTERS[mtp][2] or extra:  # attached under auto: the pair, naming the file
            assert line.startswith("auto -> select(ngram+draft-head): ") and mtp in line
        else:
            assert line == "auto -> ngram"
