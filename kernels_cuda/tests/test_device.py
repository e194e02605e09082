"""On a CUDA device with CuPy: every kernel against its torch contract, the qwen35 target and the
DFlash drafter on ``cuda`` with the kernels against the same code on torch ops, and lossless
speculative decoding on ``cuda``. Skipped (with the reason) where no kernel can run."""

from __future__ import annotations

import pytest
import torch

from tsspec.testing import OracleSpeculator, RandomSpeculator, assert_lossless
from tsspec_kernels_cuda import check
from tsspec_kernels_cuda.loader import probe

pytestmark = pytest.mark.cuda
_FOUND = probe()
if not (_FOUND.available and torch.cuda.is_available()):
    pytest.skip(f"no CUDA kernels here ({_FOUND.describe() if not _FOUND.available else 'torch has no CUDA'})",
                allow_module_level=True)

from tsspec_kernels_cuda import ops  # noqa: E402

CUDA_OPS = {op: getattr(ops, op) for op in (
    "gdn_verify", "gdn_step", "gdn_commit", "dflash_inject", "dflash_block_attention", "dflash_grouped_conv",
    "selector_lattice")}
F32_TOL = 1e-5
ODD = check.Sizes(nk=3, nv=6, dk=24, dv=72, verify_rows=9, gdn_layers=2, hidden=96, taps=3, d_layers=3, heads=6,
                  kv_heads=3, head_dim=32, block=7, ring_rows=64, context=50, inject_rows=9, conv_k=4, conv_group=12,
                  vocab=1000, rank=24, top_k=6, target_bytes=10**6)


@pytest.mark.parametrize("sizes", [check.TINY, ODD], ids=["tiny", "odd"])
@pytest.mark.parametrize("seed", [0, 1])
def test_kernels_equal_their_contracts(sizes, seed):
    errors = {**check.check_gdn(CUDA_OPS, sizes, "cuda", seed), **check.check_dflash(CUDA_OPS, sizes, "cuda", seed),
              **check.check_lattice(CUDA_OPS, sizes, "cuda", seed)}
    bad = {k: v for k, v in errors.items() if not v <= F32_TOL}
    assert not bad, bad


def _qwen(kernels, seed=3):
    from tsspec_model_qwen35.loader import load_from_source
    from tsspec_model_qwen35.source import MemorySource
    from tsspec_model_qwen35.synthetic import SyntheticSpec, random_model

    spec = SyntheticSpec(vocab_size=64, hidden_size=64, num_layers=4, num_heads=2, num_kv_heads=1, head_dim=32,
                         rope_dims=16, num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32, ffn_size=96)
    arch, meta, tensors = random_model(spec, seed=seed)
    return load_from_source(MemorySource(arch, meta, tensors), dtype="float32", device="cuda", kernels=kernels)


def test_qwen35_on_cuda_with_kernels_equals_torch_on_cuda():
    torch_target, kernel_target = _qwen(None), _qwen(CUDA_OPS)
    steps = [([1, 2, 3, 4, 5], 5), ([7], 1), ([8, 9, 10, 11], 2), ([12], 1), ([13, 14, 15], 3), ([16], 1)]
    for tokens, keep in steps:
        verify = len(tokens) > 1  # multi-row forwards verify (slots), one-row ones commit
        outs = []
        for target in (torch_target, kernel_target):
            logits, _ = target.spec_forward(tokens, all_logits_rows=verify, want_hidden=False)
            assert target.spec_keep(keep) == "committed"
            outs.append(logits)
        assert check.rel_err(outs[1], outs[0]) < 1e-4
    assert kernel_target.kernels_in_use == ["gdn_commit", "gdn_step", "gdn_verify"]
    from tsspec.cli.generate_cmd import describe_target

    assert "device kernels gdn_commit, gdn_step, gdn_verify" in describe_target(kernel_target)


def test_lossless_on_cuda_with_kernels():
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions

    prompt = [1, 2, 3, 4, 5, 6]
    plain = generate(_qwen(CUDA_OPS), prompt, SpeculationOptions(enabled=False), max_tokens=24)
    ref = prompt + plain.tokens
    assert_lossless(lambda: _qwen(CUDA_OPS), lambda t: OracleSpeculator(ref, corrupt=0.4, vocab_size=64,
                                                                         max_draft_tokens=3), prompt, max_tokens=24)
    assert_lossless(lambda: _qwen(CUDA_OPS), lambda t: RandomSpeculator(64, max_draft_tokens=3, seed=2), prompt,
                    max_tokens=16)


def test_dflash_on_cuda_with_kernels_equals_torch_on_cuda(dflash_pair):
    plain, _, feats = dflash_pair(4, {})
    plain_cuda = type(plain)(plain.config, plain.weights, _CudaTarget(plain.target))
    fused_cuda = type(plain)(plain.config, plain.weights, _CudaTarget(plain.target), kernels=CUDA_OPS)
    for head in (plain_cuda, fused_cuda):
        head.draft_catch_up(list(range(12)), feats[:12], 1)
    a, b = plain_cuda.block_hidden(5, 12), fused_cuda.block_hidden(5, 12)
    assert check.rel_err(b, a) < 1e-4
    assert plain_cuda.draft_block(5, feats[11], 12, 4)[0] == fused_cuda.draft_block(5, feats[11], 12, 4)[0]
    assert {"dflash_inject", "dflash_block_attention", "dflash_grouped_conv", "selector_lattice"} <= set(
        fused_cuda.kernels_in_use)


class _CudaTarget:
    device = torch.device("cuda")

    def __init__(self, cpu_target):
        self.table = cpu_target.table.cuda()

    def embed(self, ids):
        return self.table[torch.as_tensor(ids, device="cuda")]

    def lm_head(self, h):
        return h.to("cuda") @ self.table.T
