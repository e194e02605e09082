"""A whole step in one native call (``model_step``: embedding rows, blocks, the final norm in
torch's order, the LM head) against the Python path around ``layers_forward``: the same logits
and hidden rows bit for bit, on tiny random llamas in both block arithmetics and on the
embedded model; the calls it does not take fall back to the Python path."""

from __future__ import annotations

import pytest
import torch

from tsspec_gguf import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels were not built")

ARITHMETIC = {"float32": "float32-blocks", "int8": "int8"}
SHAPES = {"gqa": {}, "bias": {"attention_bias": True}, "mqa": {"num_key_value_heads": 1}, "tied": {"tie_word_embeddings": True}}


class CountingKernels:
    """The step extension with its ``model_step`` calls counted."""

    def __init__(self, kernels):
        self._kernels, self.steps = kernels, 0

    def __getattr__(self, name):
        return getattr(self._kernels, name)

    def model_step(self, *args):
        self.steps += 1
        return self._kernels.model_step(*args)


def prompt(n: int, seed: int = 1, vocab: int = 300) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


# (rows, all_logits_rows, want_hidden) of the calls after a reset: a prefill, decodes, verifies
CALLS = [(20, False, False), (1, False, False), (1, False, True), (4, True, True), (1, True, False), (9, True, False),
         (3, False, True), (1, False, False)]


def require_torch_norm_order(target) -> None:
    """Skip where this torch sums its RMSNorm in an order the kernels do not know: the target
    then keeps torch's op and the Python path (a fallback tested on its own below)."""
    from tsspec_gguf import rowops

    if rowops.torch_norm_lanes(target.hparams.hidden_size, target._eps) is None:
        pytest.skip("this torch's rms_norm order is not one the kernels reproduce: no one-call step here")


def run_calls(target, ids: list[int], one_call: bool) -> tuple[list[torch.Tensor], int]:
    """Every output of CALLS, and how many went through ``model_step``."""
    counting = CountingKernels(target._step_kernels)
    target._step_kernels = counting
    target.native_step = one_call
    target.reset()
    out, at = [], 0
    try:
        for rows, all_rows, hidden in CALLS:
            logits, h = target.spec_forward(ids[at : at + rows], all_logits_rows=all_rows, want_hidden=hidden)
            out += [logits] + ([h] if hidden else [])
            at += rows
    finally:
        target._step_kernels = counting._kernels
        target.native_step = True
    return out, counting.steps


def assert_same(target, ids: list[int]) -> int:
    python, none = run_calls(target, ids, one_call=False)
    native_out, steps = run_calls(target, ids, one_call=True)
    assert none == 0
    assert len(python) == len(native_out)
    for k, (a, b) in enumerate(zip(native_out, python)):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape, f"output {k}"
        assert torch.equal(a, b), f"output {k}: max diff {(a - b).abs().max().item()}"
    return steps


@pytest.mark.parametrize("arithmetic", sorted(ARITHMETIC))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_one_call_steps_equal_the_python_path_on_tiny_llamas(tiny, shape, arithmetic):
    from gguf import GGMLQuantizationType as T

    _, target, _ = tiny(quantize={"*": T.Q4_1, "attn_v": T.Q8_0}, dtype=ARITHMETIC[arithmetic], **SHAPES[shape])
    require_torch_norm_order(target)
    assert target._step_head is not None
    steps = assert_same(target, prompt(40))
    # hidden rows of several positions without every row's logits take the Python path (the
    # 3-row call); a one-row step with its hidden row takes the one call
    assert steps == len(CALLS) - 1


def test_one_call_steps_equal_the_python_path_on_the_embedded_model(embedded_target):
    require_torch_norm_order(embedded_target)
    ids = embedded_target.tokenizer.encode("Rewrite: the quick brown fox jumps over the lazy dog, twice over, and again.")
    assert assert_same(embedded_target, ids + ids) == len(CALLS) - 1


def test_long_calls_take_the_python_path(tiny):
    from gguf import GGMLQuantizationType as T

    _, target, _ = tiny(quantize={"*": T.Q4_1})
    counting = CountingKernels(target._step_kernels)
    target._step_kernels = counting
    try:
        target.spec_forward(prompt(80), all_logits_rows=False, want_hidden=False)  # more than GEMM_ROWS rows
        assert counting.steps == 0
        target.spec_forward([3], all_logits_rows=False, want_hidden=False)
        assert counting.steps == 1
    finally:
        target._step_kernels = counting._kernels


@pytest.mark.parametrize("arithmetic", sorted(ARITHMETIC))
@pytest.mark.parametrize("taps", [[1], [0, 2], [2, 0, 1, 1]])  # the tiny llama has 2 blocks: taps 0..2
def test_feature_taps_take_the_one_call_with_the_python_paths_rows(tiny, taps, arithmetic):
    """With feature taps (a block drafter's hidden rows: the residuals entering those layers,
    side by side in the taps' order, repeats included) every call takes the one native call, the
    hidden rows of several positions without every row's logits too, and returns the Python
    path's logits and tapped rows bit for bit."""
    from gguf import GGMLQuantizationType as T

    _, target, _ = tiny(quantize={"*": T.Q4_1, "attn_v": T.Q8_0}, dtype=ARITHMETIC[arithmetic])
    require_torch_norm_order(target)
    target.spec_set_feature_taps(taps)
    try:
        assert assert_same(target, prompt(40)) == len(CALLS)
        logits, hidden = target.spec_forward([5, 6], all_logits_rows=True, want_hidden=True)
        assert hidden.shape == (2, len(taps) * target.hparams.hidden_size)
    finally:
        target.spec_set_feature_taps(None)


def test_any_number_of_feature_taps_takes_the_one_call(tiny):
    """Taps are any sequence of layer ids in 0..n_layers (repeats included): 66 of them take the
    one call too, with the Python path's rows (the call once refused more than 64)."""
    from gguf import GGMLQuantizationType as T

    _, target, _ = tiny(quantize={"*": T.Q4_1})
    require_torch_norm_order(target)
    target.spec_set_feature_taps([1, 0, 2] * 22)
    try:
        assert assert_same(target, prompt(40)) == len(CALLS)
    finally:
        target.spec_set_feature_taps(None)


def test_feature_taps_on_the_embedded_model_take_the_one_call(embedded_target):
    require_torch_norm_order(embedded_target)
    embedded_target.spec_set_feature_taps([1, 15, 30])  # as a DFlash drafter's (0..n_layers)
    try:
        ids = embedded_target.tokenizer.encode("Rewrite: the quick brown fox jumps over the lazy dog, twice over, and again.")
        assert assert_same(embedded_target, ids + ids) == len(CALLS)
    finally:
        embedded_target.spec_set_feature_taps(None)


def test_without_a_matching_norm_order_the_python_path_runs(tiny, monkeypatch):
    """Where the kernels cannot reproduce this torch's final norm, the target keeps torch's."""
    from gguf import GGMLQuantizationType as T

    from tsspec_model_llama import target as target_module

    monkeypatch.setattr(target_module, "torch_norm_lanes", lambda n, eps: None)
    _, target, _ = tiny(quantize={"*": T.Q4_1})
    assert target._stack is not None and target._step_head is None
    logits, _ = target.spec_forward(prompt(5), all_logits_rows=False, want_hidden=False)
    assert logits.shape == (1, 300)


def test_bad_token_ids_are_refused_before_the_call(embedded_target):
    embedded_target.reset()
    with pytest.raises(ValueError, match="token ids must lie in"):
        embedded_target.spec_forward([embedded_target.hparams.vocab_size], all_logits_rows=False, want_hidden=False)
    with pytest.raises(ValueError, match="token ids must lie in"):
        embedded_target.spec_forward([-1], all_logits_rows=False, want_hidden=False)
    assert embedded_target.cache_seq_len == 0


def test_model_step_refuses_bad_operands(embedded_target):
    t = embedded_target
    embed, lm_head, lanes, _, _ = t._step_head
    x = torch.empty((2, t.hparams.hidden_size))
    t.spec_ensure_capacity(4)
    args = [t._stack, [1], embed, x.data_ptr(), 0, t._k.data_ptr(), t._v.data_ptr(), t._capacity, 1, 1, False]
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 49152\)"):
        t._step_kernels.model_step(*args[:1], [49152], *args[2:], None)
    with pytest.raises(ValueError, match="operands"):
        t._step_kernels.model_step(*args[:4], t._capacity, *args[5:], None)  # no room past the cache
    head = (t._output_norm.data_ptr(), t._eps, lanes, x.data_ptr(), 1, lm_head, x.data_ptr())
    with pytest.raises(ValueError, match="head operands"):  # the first kept row past the last
        t._step_kernels.model_step(*args, head)
    narrow = (embed[0], embed[1], embed[2], embed[3], embed[4], 64)
    with pytest.raises(ValueError, match="width"):
        t._step_kernels.model_step(*args[:2], narrow, *args[3:], None)
    for taps in (([31], x.data_ptr()), ([-1], x.data_ptr()), ([], x.data_ptr()), ([1], 0)):  # 30 blocks
        with pytest.raises(ValueError, match="taps"):
            t._step_kernels.model_step(*args, None, taps)
    with pytest.raises(TypeError, match="taps must be None or a"):  # not a tuple
        t._step_kernels.model_step(*args, None, [[1], x.data_ptr()])


@pytest.mark.parametrize("all_rows", [False, True])
def test_calls_at_the_row_limit_equal_the_python_path(tiny, all_rows):
    """GEMM_ROWS rows (the residual and, with every row's logits, the normed rows fill the
    target's scratch exactly) run in one call; more (GEMM_ROWS + 2) take the Python path; the same
    logits and hidden rows either way."""
    from gguf import GGMLQuantizationType as T

    from tsspec_gguf.qlinear import GEMM_ROWS

    _, target, _ = tiny(quantize={"*": T.Q4_1})
    require_torch_norm_order(target)
    ids = prompt(2 * GEMM_ROWS + 2)
    outputs, steps = [], []
    for one_call in (False, True):
        counting = CountingKernels(target._step_kernels)
        target._step_kernels, target.native_step = counting, one_call
        try:
            target.reset()
            first = target.spec_forward(ids[:GEMM_ROWS], all_logits_rows=all_rows, want_hidden=all_rows)
            second = target.spec_forward(ids[GEMM_ROWS:], all_logits_rows=all_rows, want_hidden=all_rows)
        finally:
            target._step_kernels, target.native_step = counting._kernels, True
        outputs.append([t for pair in (first, second) for t in pair if t is not None])
        steps.append(counting.steps)
    assert steps == [0, 1]  # GEMM_ROWS rows in one call, GEMM_ROWS + 2 on the Python path
    for a, b in zip(*outputs):
        assert torch.equal(a, b)
