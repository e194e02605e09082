"""The qwen35 plugin's kernel call sites, driven on the CPU by the torch contracts registered as
its kernels: the same logits as the torch path, per-row slots committed by ``gdn_commit`` after
partial acceptance, one-row steps through ``gdn_step``, and lossless speculative decoding.
On a GPU the device check runs the same tests with the CUDA ops."""

from __future__ import annotations

import pytest
import torch

from tsspec.testing import OracleSpeculator, RandomSpeculator, assert_lossless
from tsspec_kernels_cuda import reference

loader = pytest.importorskip("tsspec_model_qwen35.loader")
from tsspec_model_qwen35.source import MemorySource  # noqa: E402
from tsspec_model_qwen35.synthetic import SyntheticSpec, random_model  # noqa: E402

TINY = SyntheticSpec(vocab_size=64, hidden_size=32, num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16,
                     rope_dims=8, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8, ffn_size=48)
GDN_OPS = {op: getattr(reference, op) for op in ("gdn_verify", "gdn_step", "gdn_commit")}


def make(kernels=None, *, device="cpu", seed=3):
    arch, meta, tensors = random_model(TINY, seed=seed)
    return loader.load_from_source(MemorySource(arch, meta, tensors), dtype="float32", device=device,
                                   kernels=kernels)


def _run(target, steps):
    """Prefill, then (tokens, keep) verifies/steps; returns every logits tensor."""
    out = []
    logits, _ = target.spec_forward([1, 2, 3, 4, 5], all_logits_rows=False, want_hidden=False)
    out.append(logits)
    for tokens, keep in steps:
        logits, _ = target.spec_forward(tokens, all_logits_rows=len(tokens) > 1, want_hidden=False)
        out.append(logits)
        assert target.spec_keep(keep) == "committed"
    return out


STEPS = [([7], 1), ([8, 9, 10, 11], 2), ([12], 1), ([13, 14, 15], 3), ([16, 17], 1), ([18], 1)]


def test_kernel_path_equals_the_torch_path():
    torch_target, kernel_target = make(), make(GDN_OPS)
    for a, b in zip(_run(torch_target, STEPS), _run(kernel_target, STEPS)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert kernel_target.kernels_in_use == ["gdn_commit", "gdn_step", "gdn_verify"]
    assert torch_target.kernels_in_use == []
    for (_, a), (_, b) in zip(torch_target._state.recurrent(), kernel_target._state.recurrent()):
        torch.testing.assert_close(b.ssm, a.ssm, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.conv, a.conv, rtol=1e-5, atol=1e-6)


def test_commit_is_one_call_for_every_layer():
    calls = []

    def counting_commit(slots, windows, states, convs, m):
        calls.append((len(states), m))
        reference.gdn_commit(slots, windows, states, convs, m)

    target = make({**GDN_OPS, "gdn_commit": counting_commit})
    _run(target, [([8, 9, 10, 11], 2)])
    assert calls == [(3, 1)]  # three GDN layers, slot 1 (two rows kept), one call


def test_a_float64_model_keeps_torch():
    arch, meta, tensors = random_model(TINY, seed=3)
    target = loader.load_from_source(MemorySource(arch, meta, tensors), dtype="float64", kernels=GDN_OPS)
    _run(target, STEPS[:2])
    assert target.kernels_in_use == []


@pytest.mark.parametrize("seed", [0])
def test_lossless_on_the_kernel_path(seed):
    def factory():
        return make(GDN_OPS, seed=seed)

    plain_target = factory()
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions

    prompt = [1, 2, 3, 4, 5, 6]
    plain = generate(plain_target, prompt, SpeculationOptions(enabled=False), max_tokens=20)
    ref = prompt + plain.tokens
    assert_lossless(factory, lambda t: OracleSpeculator(ref, corrupt=0.4, vocab_size=64, max_draft_tokens=3),
                    prompt, max_tokens=20)
    assert_lossless(factory, lambda t: RandomSpeculator(64, max_draft_tokens=3, seed=seed), prompt, max_tokens=16)


def test_cuda_device_is_refused_clearly_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from tsspec.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="no CUDA device"):
        loader.resolve_device("m.gguf", "cuda")
    with pytest.raises(ModelLoadError, match="not a torch device"):
        loader.resolve_device("m.gguf", "gpu7")
