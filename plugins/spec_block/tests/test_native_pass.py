"""The DFlash drafter's matrices on the compiled CPU kernels (int8 blocks): close to the torch
reference on random and on the shipped drafter's real rows, lossless through the loop, and off
where it cannot run or is switched off."""

from __future__ import annotations

import pytest
import torch

from tsspec_gguf import native
from tsspec.runtime.loading import LoadOptions
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import ToyTarget, assert_lossless
from tsspec_gguf.random_llama import write_random_llama

from tsspec_block.attach import attach_dflash
from tsspec_block.head import NATIVE_ENV, NATIVE_OP
from tsspec_block.speculator import make_block_speculator
from tsspec_block.native_pass import NativeBlockPass


OPTIONS = SpeculationOptions(spec_type="block", pmin=0.0, adaptive=False)
TOY = dict(hidden_size=16, target_layers=[1, 2], mask_token_id=31, num_layers=2, block_size=6, sliding_window=8)

pytestmark = pytest.mark.skipif(native.kernels() is None, reason="the compiled CPU kernels are not built")

# int8 weights (one scale per 32) against float32 ones: the logits of a 1-layer drafter move by
# about 1% of their range (measured 1.3% on the shipped drafter); 5% bounds it with room
RELATIVE_TOL = 0.05


def _tiny_llama(tmp_path):
    """A loader of a tiny random llama (hidden 32: whole int8 blocks), float32."""
    pytest.importorskip("tsspec_model_llama")
    from tsspec_model_llama import load_llama

    path = write_random_llama(tmp_path / "tiny.gguf", vocab=128, hidden=32, ffn=64, layers=3, heads=4, kv_heads=2,
                              context=512, seed=0, name="tiny native-pass target")
    return lambda: load_llama(str(path), LoadOptions(dtype="float32"))


def _pair(head):
    """(native view, torch view) of one head, each with a context of its own."""
    ref = head.for_sequence()
    ref.native = None
    return head.for_sequence(), ref


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference over the finite entries, relative to the reference's largest |entry|."""
    finite = torch.isfinite(b)
    assert torch.equal(finite, torch.isfinite(a))  # the draft vocabulary's -inf in the same places
    return float((a[finite] - b[finite]).abs().max() / b[finite].abs().max())


def test_native_pass_tracks_the_torch_pass_on_a_random_drafter(tmp_path, drafter_file):
    target = _tiny_llama(tmp_path)()
    path = drafter_file(tmp_path / "d.gguf", hidden_size=32, target_layers=[1, 2, 3], mask_token_id=63,
                        num_layers=2, block_size=6, sliding_window=16, vocab_size=128)
    head = attach_dflash(target, path, LoadOptions(dtype="float32"))
    assert isinstance(head.native, NativeBlockPass)
    fast, ref = _pair(head)
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(40, head.feature_size, generator=g)  # [rows, F]
    for view in (fast, ref):
        view.draft_catch_up(list(range(40)), feats, 1)  # positions 0..39, sliding window 16
    for anchor, position in ((5, 40), (17, 41)):
        a, b = fast.block_hidden(anchor, position), ref.block_hidden(anchor, position)
        assert _close(a, b) < RELATIVE_TOL
        assert not torch.equal(a, b)  # the int8 path really ran
    assert NATIVE_OP in head.kernels_in_use


@pytest.mark.parametrize("governed", [False, True], ids=["gate", "governed"])
@pytest.mark.parametrize("sampling", [None, SamplingParams(temperature=0.7, seed=5)], ids=["greedy", "sampled"])
def test_native_pass_is_lossless_on_a_real_model_target(tmp_path, drafter_file, sampling, governed):
    """The gate alone (governor off), and the governor on."""
    make_target = _tiny_llama(tmp_path)
    probe = make_target()
    layers = probe.config.num_layers
    path = drafter_file(tmp_path / "d.gguf", hidden_size=32, target_layers=[1, layers // 2 + 1, layers],
                        mask_token_id=63, num_layers=1, block_size=6, sliding_window=16, vocab_size=128)
    heads, specs = [], []
    options = SpeculationOptions(spec_type="block", pmin=0.0) if governed else OPTIONS

    def make_speculator(target):
        heads.append(attach_dflash(target, path))
        specs.append(make_block_speculator(target, options))
        return specs[-1]

    _, spec = assert_lossless(make_target, make_speculator, [5, 9, 2, 33, 17, 8, 41], max_tokens=24,
                              sampling=sampling, options=options, check_state=False)
    assert heads[0].native is not None and NATIVE_OP in heads[0].kernels_in_use
    assert spec.stats.faults == 0 and (spec.stats.draft_tokens > 0 or governed)


def test_the_switch_and_unsupported_drafters_keep_the_torch_path(tmp_path, drafter_file, monkeypatch):
    path = drafter_file(tmp_path / "d.gguf", **TOY)  # hidden 16: not whole 32-weight blocks
    assert attach_dflash(ToyTarget(), path, LoadOptions(dtype="float32")).native is None
    wide = drafter_file(tmp_path / "w.gguf", **{**TOY, "hidden_size": 32})
    target = ToyTarget(hidden_size=32)
    assert attach_dflash(target, wide, LoadOptions(dtype="float32")).native is not None
    assert attach_dflash(ToyTarget(hidden_size=32), wide).native is None  # the toy's float64: torch
    monkeypatch.setenv(NATIVE_ENV, "0")
    assert attach_dflash(ToyTarget(hidden_size=32), wide, LoadOptions(dtype="float32")).native is None


@pytest.fixture(scope="module")
def shipped():
    """The embedded model (float32) with the shipped DFlash drafter attached, and a prompt."""
    pytest.importorskip("tsspec_model_llama")
    drafters = pytest.importorskip("tsspec_drafters_smollm2")
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec_model_llama import load_llama

    path = drafters.HERE / "smollm2-135m-instruct-dflash.gguf"
    if not path.is_file():
        pytest.skip("the shipped DFlash drafter is absent")
    target = load_llama(str(embedded_model_path()), LoadOptions())
    head = attach_dflash(target, str(path))
    tok = target.tokenizer
    text = "Explain in two sentences why the sky is blue, then list three colours of a sunset."
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]), add_special_tokens=False)
    return target, head, list(ids)


def test_native_pass_matches_the_torch_pass_on_the_shipped_drafters_real_rows(shipped):
    """The drafter's logits over its draft vocabulary at several real positions: within
    RELATIVE_TOL of the torch pass, and the same top-1 wherever the torch pass's top-2 margin is
    wider than twice the largest difference seen (a closer call may go either way)."""
    target, head, ids = shipped
    assert head.native is not None and head.native.draft_head is not None
    fast, ref = _pair(head)
    with torch.inference_mode():
        target.spec_ensure_capacity(len(ids) + 2)
        _, feats = target.spec_forward(ids, all_logits_rows=False, want_hidden=True)  # [T, F]
        target.spec_rewind_cache(0)
    rows = torch.cat([torch.zeros_like(feats[:1]), feats[:-1]])  # row k predicts token k
    worst, decided, agreed = 0.0, 0, 0
    for cut in (len(ids) - 20, len(ids) - 9, len(ids) - 1):
        for view in (fast, ref):
            view.reset()
            view.draft_catch_up(ids[:cut], rows[:cut], 0)
        a, b = fast.block_logits(ids[cut], cut), ref.block_logits(ids[cut], cut)  # [B-1, vocab]
        err = _close(a, b)
        worst = max(worst, err)
        scale = float(b[torch.isfinite(b)].abs().max())
        top2 = b.topk(2, dim=-1).values  # [B-1, 2]
        sure = (top2[:, 0] - top2[:, 1]) > 2 * err * scale
        decided += int(sure.sum())
        agreed += int((a.argmax(-1) == b.argmax(-1))[sure].sum())
    assert worst < RELATIVE_TOL
    assert decided >= 3 and agreed == decided


@pytest.mark.parametrize("governed", [False, True], ids=["gate", "governed"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_k=40, seed=5)],
                         ids=["greedy", "sampled"])
def test_the_shipped_drafter_on_the_native_pass_is_lossless(shipped, sampling, governed):
    from tsspec.runtime.generation import generate

    target, head, ids = shipped
    options = SpeculationOptions(spec_type="block", adaptive=governed, pmin=0.0)
    plain = generate(target, list(ids), SpeculationOptions(enabled=False), max_tokens=20, sampling=sampling)
    speculator = make_block_speculator(target, options)
    spec = generate(target, list(ids), options, max_tokens=20, sampling=sampling, speculator=speculator)
    assert spec.tokens == plain.tokens
    assert NATIVE_OP in head.kernels_in_use
    assert spec.stats.draft_tokens > 0 or governed


def test_a_prepared_block_gives_any_subset_of_its_rows(tmp_path, drafter_file):
    """``finish`` computes only the rows asked for (the last layer's queries, attention and FFN
    of those rows): the same rows as the whole block's, for two layers (the first runs every
    row) and a sliding window."""
    target = _tiny_llama(tmp_path)()
    path = drafter_file(tmp_path / "d.gguf", hidden_size=32, target_layers=[1, 3], mask_token_id=63, num_layers=2,
                        block_size=6, sliding_window=4, vocab_size=128)
    head = attach_dflash(target, path, LoadOptions(dtype="float32"))
    g = torch.Generator().manual_seed(2)
    head.draft_catch_up(list(range(20)), torch.randn(20, head.feature_size, generator=g), 1)
    whole = head.block_hidden(7, 20)  # [B, H]
    state = head._native_block(7, 20)
    for lo, hi in ((1, 2), (2, 6), (0, 3)):
        assert torch.allclose(head.native.finish(state, lo, hi), whole[lo:hi], atol=1e-5, rtol=1e-5)
