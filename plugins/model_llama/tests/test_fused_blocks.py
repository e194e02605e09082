"""The fused block path (every block in one native call, ``layers_forward``) against the per-op
kernel path (``_kernel_block``): bit for bit, in both block arithmetics, on tiny random llamas
and the embedded model, with and without feature taps."""

from __future__ import annotations

import pytest
import torch

from tsspec_gguf import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels were not built")

ARITHMETIC = {"float32": "float32-blocks", "int8": "int8"}
SHAPES = {"gqa": {}, "bias": {"attention_bias": True}, "head_dim": {"head_dim": 24}, "mqa": {"num_key_value_heads": 1}}


def prompt(n: int, seed: int = 1, vocab: int = 300) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def run_both(target, ids: list[int], splits: list[int], taps) -> dict[bool, list[torch.Tensor]]:
    """Logits and hidden rows of a prefill then verifies/decodes (``splits``: the row counts of
    the calls after the first), per-op (False) and fused (True)."""
    out = {}
    for fused in (False, True):
        target.fused_blocks = fused
        target.reset()
        target.spec_set_feature_taps(taps)
        results, at = [], 0
        for n in splits:
            logits, hidden = target.spec_forward(ids[at : at + n], all_logits_rows=True, want_hidden=True)
            results += [logits, hidden]
            at += n
        out[fused] = results
    target.fused_blocks = True
    target.spec_set_feature_taps(None)
    target.reset()
    return out


def assert_bit_equal(out: dict[bool, list[torch.Tensor]]) -> None:
    for k, (fused, per_op) in enumerate(zip(out[True], out[False])):
        assert torch.equal(fused, per_op), f"output {k}: max diff {(fused - per_op).abs().max().item()}"


@pytest.mark.parametrize("arithmetic", sorted(ARITHMETIC))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fused_blocks_equal_per_op_blocks_on_tiny_llamas(tiny, shape, arithmetic):
    from gguf import GGMLQuantizationType as T

    _, target, _ = tiny(quantize={"*": T.Q4_1, "attn_v": T.Q8_0}, dtype=ARITHMETIC[arithmetic], **SHAPES[shape])
    assert target._stack is not None and target.precision == arithmetic
    ids = prompt(40)
    assert_bit_equal(run_both(target, ids, [20, 9, 1, 1, 4], taps=None))
    assert_bit_equal(run_both(target, ids, [20, 9, 1], taps=[0, 1, 2]))


@pytest.mark.parametrize("arithmetic", sorted(ARITHMETIC))
def test_fused_blocks_equal_per_op_blocks_on_a_q8_0_llama(tiny, arithmetic):
    """Q8_0 everywhere: the block matrices and the LM head are format 8 with every m 0, so the
    fused path describes them with zero_m (a decode row's pairs multiply q by d and read no m)
    while the per-op path reads m: the same bits, and the same with the switch off."""
    from gguf import GGMLQuantizationType as T

    _, target, _ = tiny(quantize={"*": T.Q8_0}, dtype=ARITHMETIC[arithmetic])
    layer = target._layers[0]
    assert all(w.fmt == 8 and not w.m.any() for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down))
    ids = prompt(40)
    out = run_both(target, ids, [20, 1, 1, 4, 1], taps=None)
    assert_bit_equal(out)
    native.kernels().set_zero_m(False)
    try:
        off = run_both(target, ids, [20, 1, 1, 4, 1], taps=None)
    finally:
        native.kernels().set_zero_m(True)
    assert all(torch.equal(a, b) for a, b in zip(out[True], off[True]))


def test_dense_matrices_keep_the_per_op_path(tiny):
    """A target whose matrices are not all blocks has no layer stack (the per-op path runs)."""
    _, target, _ = tiny(dtype="float32")
    assert target._stack is None
    target.spec_forward(prompt(5), all_logits_rows=False, want_hidden=False)


@pytest.mark.parametrize("arithmetic", sorted(ARITHMETIC))
def test_fused_blocks_equal_per_op_blocks_on_the_embedded_model(embedded_path, arithmetic):
    from tsspec_model_llama import load_llama

    target = load_llama(embedded_path, {"dtype": ARITHMETIC[arithmetic]})
    ids = target.tokenizer.encode("Rewrite: the quick brown fox jumps over the lazy dog, twice over, and again.")
    assert_bit_equal(run_both(target, ids, [8, 9, 1, 2], taps=[2, 15, 30]))


def test_layer_stack_rejects_bad_descriptions():
    kernels = native.kernels()
    with pytest.raises(ValueError, match="dimensions"):
        kernels.layers_new((64, 3, 2, 16, 16, 96, 1e-5), [])  # heads not a multiple of kv heads
    norm = torch.ones(64)
    wrong = (4, 1, 1, 1, 64, 64)  # wqkv must be [(4 + 2 * 2) * 16, 64]
    with pytest.raises(ValueError, match="wqkv"):
        kernels.layers_new((64, 4, 2, 16, 16, 96, 1e-5), [(norm.data_ptr(), 0, 0, norm.data_ptr(), wrong, wrong, wrong, wrong)])
    stack = kernels.layers_new((64, 4, 2, 16, 16, 96, 1e-5), [])
    x = torch.zeros(1, 64)
    with pytest.raises(ValueError, match="operands"):  # layers beyond the stack
        kernels.layers_forward(stack, 0, 1, x.data_ptr(), 1, 0, x.data_ptr(), x.data_ptr(), 4, x.data_ptr(), 1, False)
