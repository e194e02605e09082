"""LlamaTarget against transformers on tiny random llamas (float32: 1e-4), plus the target
contract: incremental decode, multi-row verify, rewind, capacity growth, taps, drafter surface."""

from __future__ import annotations

import os

import pytest
import torch

from tsspec.errors import GenerationError
from tsspec.protocols import SpeculativeTarget

TOL = 1e-4
CONFIGS = {
    "gqa": {},
    "mha": {"num_key_value_heads": 4},
    "mqa": {"num_key_value_heads": 1},
    "tied": {"tie_word_embeddings": True},
    "bias": {"attention_bias": True},
    "head_dim": {"head_dim": 24},
    "linear_rope": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}},
}


def hf_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # [rows, vocab]


def assert_close(got: torch.Tensor, expected: torch.Tensor, tol: float = TOL) -> None:
    scale = expected.abs().max().item()
    err = (got - expected).abs().max().item()
    assert err <= tol * max(scale, 1.0), f"max abs error {err} at scale {scale}"


def prompt(n: int, seed: int = 1, vocab: int = 300) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prompt_and_incremental_logits_match_transformers(tiny, name):
    model, target, _ = tiny(**CONFIGS[name])
    ids = prompt(24)
    expected = hf_logits(model, ids)
    prefill, _ = target.spec_forward(ids[:16], all_logits_rows=True, want_hidden=False)
    steps = [target.spec_forward([t], all_logits_rows=False, want_hidden=False)[0] for t in ids[16:20]]
    verify, _ = target.spec_forward(ids[20:], all_logits_rows=True, want_hidden=False)
    got = torch.cat([prefill, *steps, verify])
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert_close(got, expected)
    assert target.cache_seq_len == 24


def test_llama3_frequency_factors_match_transformers(tiny):
    """Llama-3.1 style RoPE scaling reaches GGUF as rope_freqs (per-frequency divisors)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    scaled = LlamaForCausalLM(LlamaConfig(**{**_tiny_config(), "rope_parameters": rope}))
    plain = LlamaForCausalLM(LlamaConfig(**_tiny_config()))
    divisors = plain.model.rotary_emb.inv_freq / scaled.model.rotary_emb.inv_freq  # [hd / 2]
    assert not torch.allclose(divisors, torch.ones_like(divisors))
    model, target, _ = tiny(rope_parameters=rope, rope_freqs=divisors.numpy())
    ids = prompt(40)
    got, _ = target.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    assert_close(got, hf_logits(model, ids))


def _tiny_config():
    return dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def test_multi_row_verify_equals_one_row_decode(tiny):
    _, target, _ = tiny()
    ids = prompt(20)
    target.spec_forward(ids[:12], all_logits_rows=False, want_hidden=False)
    one_row = [target.spec_forward([t], all_logits_rows=False, want_hidden=True) for t in ids[12:]]
    target.spec_rewind_cache(12)
    rows, hidden = target.spec_forward(ids[12:], all_logits_rows=True, want_hidden=True)
    assert rows.shape == (8, 300) and hidden.shape == (8, 64)
    for k, (logits, h) in enumerate(one_row):
        assert torch.allclose(rows[k], logits[0], atol=1e-5, rtol=0)
        assert torch.allclose(hidden[k], h[0], atol=1e-5, rtol=0)


def test_rewind_then_reforward_gives_the_same_logits(tiny):
    _, target, _ = tiny()
    ids = prompt(16)
    target.spec_forward(ids[:10], all_logits_rows=False, want_hidden=False)
    first, _ = target.spec_forward(ids[10:], all_logits_rows=True, want_hidden=False)
    target.spec_rewind_cache(10)
    # a rejected tail: different tokens overwrite the slots, then we rewind again
    target.spec_forward(prompt(6, seed=9), all_logits_rows=True, want_hidden=False)
    target.spec_rewind_cache(10)
    again, _ = target.spec_forward(ids[10:], all_logits_rows=True, want_hidden=False)
    assert torch.equal(first, again)
    target.spec_rewind_cache(0)
    fresh, _ = target.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    assert torch.allclose(fresh[10:], first, atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        target.spec_rewind_cache(17)


def test_cache_grows_past_its_first_allocation(tiny):
    from tsspec_model_llama.target import INITIAL_CAPACITY

    model, target, _ = tiny()
    n = INITIAL_CAPACITY + 40
    ids = prompt(n, seed=3)
    target.spec_ensure_capacity(8)
    chunks = [ids[: INITIAL_CAPACITY - 3]] + [ids[i : i + 5] for i in range(INITIAL_CAPACITY - 3, n, 5)]
    got = torch.cat([target.spec_forward(c, all_logits_rows=True, want_hidden=False)[0] for c in chunks])
    assert_close(got, hf_logits(model, ids))
    assert target._capacity >= n


def test_context_limit(tiny):
    _, target, _ = tiny(max_position_embeddings=32)
    assert target.max_context_length == 32
    with pytest.raises(GenerationError, match="context"):
        target.spec_ensure_capacity(33)
    target.spec_forward(prompt(30), all_logits_rows=False, want_hidden=False)
    with pytest.raises(GenerationError):
        target.spec_forward([1, 2, 3], all_logits_rows=False, want_hidden=False)
    with pytest.raises(ValueError, match="token ids"):
        target.spec_forward([300], all_logits_rows=False, want_hidden=False)


def test_hidden_rows_and_feature_taps_match_transformers(tiny):
    model, target, _ = tiny(num_hidden_layers=3)
    ids = prompt(12)
    with torch.no_grad():
        out = model.model(torch.tensor([ids]), output_hidden_states=True)
    states = out.hidden_states  # states[l] = residual entering layer l (l < n_layers)
    _, hidden = target.spec_forward(ids, all_logits_rows=True, want_hidden=True)
    assert target.spec_feature_size == 64
    assert_close(hidden, out.last_hidden_state[0])  # default: the final post-norm hidden

    target.spec_rewind_cache(0)
    target.spec_set_feature_taps([2, 0, 3])
    assert target.spec_feature_size == 3 * 64 and target.feature_taps == (2, 0, 3)
    logits, tapped = target.spec_forward(ids, all_logits_rows=False, want_hidden=True)
    assert tapped.shape == (12, 3 * 64) and logits.shape == (1, 300)
    assert_close(tapped[:, :64], states[2][0])
    assert_close(tapped[:, 64:128], states[0][0])
    # tap n_layers: the residual after the last layer; its final norm is last_hidden_state
    assert_close(target.final_norm(tapped[:, 128:]), out.last_hidden_state[0])
    target.spec_set_feature_taps(None)
    assert target.spec_feature_size == 64
    with pytest.raises(ValueError):
        target.spec_set_feature_taps([4])


def test_drafter_surface(tiny):
    model, target, _ = tiny(tie_word_embeddings=True)
    ids = prompt(6)
    emb = target.embed(ids)
    assert emb.shape == (6, 64) and emb.dtype == torch.float32
    assert torch.equal(emb, model.model.embed_tokens.weight[ids].detach())
    target.spec_set_feature_taps([2])
    logits, residual = target.spec_forward(ids, all_logits_rows=True, want_hidden=True)
    assert_close(target.lm_head(target.final_norm(residual)), logits)
    assert target.lm_head(torch.zeros(2, 64)).shape == (2, 300)


def test_protocol_and_config(tiny):
    _, target, _ = tiny(tie_word_embeddings=True)
    assert isinstance(target, SpeculativeTarget)
    cfg = target.config
    assert (cfg.architecture, cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.context_length) == (
        "llama", 300, 64, 2, 512)
    assert cfg.extra["num_heads"] == 4 and cfg.extra["num_kv_heads"] == 2 and cfg.extra["head_dim"] == 16
    assert cfg.extra["tied_embeddings"] is True and cfg.extra["rope_theta"] == 10000.0
    assert target.tokenizer is None and target.draft_head is None
    assert target.speculation_profitable and target.speculation_refusal is None
    assert target.spec_preferred_draft_window is None and target.spec_verify_persists_accepted_kv
    target.spec_forward([1, 2, 3], all_logits_rows=True, want_hidden=False)
    assert target.spec_keep(3) is None and target.cache_seq_len == 3
    target.spec_forward([4, 5], all_logits_rows=True, want_hidden=False)
    assert target.spec_keep(1) is None  # a KV target keeps a prefix by its length alone
    assert target.cache_seq_len == 4


def test_bfloat16_and_float64_options(tiny):
    model, target32, path = tiny()
    from tsspec_model_llama import load_llama

    ids = prompt(10)
    expected = hf_logits(model, ids)
    from tsspec_gguf import native

    bf16 = load_llama(path, {"dtype": "bf16"})
    got, _ = bf16.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    assert got.dtype == torch.float32
    assert bf16.dtype == (torch.float32 if native.available() else torch.bfloat16)  # kernel: 16-bit weights, float32 math
    assert_close(got, expected, tol=5e-2)
    if native.available():  # a verify's rows equal one-row steps bit for bit
        bf16.spec_rewind_cache(0)
        prefix, _ = bf16.spec_forward(ids[:-3], all_logits_rows=True, want_hidden=False)
        rows = [bf16.spec_forward(ids[j : j + 1], all_logits_rows=True, want_hidden=False)[0] for j in range(len(ids) - 3, len(ids))]
        assert torch.equal(torch.cat([prefix, *rows]), got)
    f64 = load_llama(path, {"dtype": "float64"})
    got, _ = f64.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    assert_close(got, expected)


@pytest.mark.parametrize("sampled", [False, True])
def test_speculative_generation_is_lossless(tiny, sampled):
    """The shared loop over this target (float64: no ties) gives plain decoding's tokens."""
    pytest.importorskip("tsspec.runtime.generation")
    from tsspec.runtime.sampling import SamplingParams
    from tsspec.testing import OracleSpeculator, RandomSpeculator, assert_lossless
    from tsspec_model_llama import load_llama

    _, _, path = tiny()
    sampling = SamplingParams(temperature=0.8, top_k=20, seed=3) if sampled else None
    make = lambda: load_llama(path, {"dtype": "float64"})  # noqa: E731
    for make_speculator in (
        lambda t: RandomSpeculator(300, max_draft_tokens=4, seed=1),
        lambda t: OracleSpeculator.from_plain_run(make(), prompt(5), 24, sampling=sampling, corrupt=0.3, seed=2),
    ):
        assert_lossless(make, make_speculator, prompt(5), max_tokens=24, sampling=sampling)


def test_thread_policy_restores_the_thread_count(tiny):
    """Small ops run on one thread inside a call; the caller's thread count comes back."""
    _, target, _ = tiny()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ids = prompt(6)
        a, _ = target.spec_forward(ids, all_logits_rows=True, want_hidden=False)
        assert torch.get_num_threads() == 2
        target.spec_rewind_cache(0)
        target.small_ops_single_thread = False
        b, _ = target.spec_forward(ids, all_logits_rows=True, want_hidden=False)
        assert torch.allclose(a, b, atol=1e-5, rtol=0) and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def assert_matches_transformers_on_the_file(path, ids, got) -> None:
    """transformers loading the same GGUF (it dequantises every type) gives these logits."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    with torch.no_grad():
        assert_close(got, hf(torch.tensor([ids])).logits[0], tol=1e-4)


QUANTISED = {
    "q8_0": {"*": "Q8_0"},
    "q4_1 + q8_0 v (widened)": {"attn_v": "Q8_0", "*": "Q4_1"},
    "q4_0, f32 head": {"token_embd": "F32", "output": "F32", "*": "Q4_0"},
    "q5_0 + q5_1 v": {"attn_v": "Q5_1", "*": "Q5_0"},
}


@pytest.mark.parametrize("scheme", list(QUANTISED))
def test_block_weights_match_dense_weights_and_transformers(tiny, scheme):
    """Quantised files keep their blocks by default; the block kernel gives the dense float32
    path's logits (which match transformers loading the same GGUF), and multi-row calls give
    one-row calls' rows."""
    from gguf import GGMLQuantizationType as T

    from tsspec_gguf import native
    from tsspec_model_llama import load_llama

    if not native.available():
        pytest.skip("the block kernel was not built")
    quantize = {frag: T[name] for frag, name in QUANTISED[scheme].items()}
    _, blocks, path = tiny(quantize=quantize)
    dense = load_llama(path, {"dtype": "float32"})
    assert blocks.config.extra["weights"] == "blocks" and dense.config.extra["weights"] == "dense"
    # every matrix of a packable type stays in blocks (only F32 ones run as float32)
    assert all(n == 0 for kind, (_, n) in blocks.served_formats.items() if kind != "F32")
    assert {k for k, (n, _) in blocks.served_formats.items() if n} == set(QUANTISED[scheme].values()) - {"F32"}
    ids = prompt(20)
    got, hidden = blocks.spec_forward(ids, all_logits_rows=True, want_hidden=True)
    expected, expected_hidden = dense.spec_forward(ids, all_logits_rows=True, want_hidden=True)
    assert_close(got, expected, tol=1e-5)
    assert_close(hidden, expected_hidden, tol=1e-5)
    assert_matches_transformers_on_the_file(path, ids, got)
    blocks.spec_rewind_cache(12)
    rows, _ = blocks.spec_forward(ids[12:], all_logits_rows=True, want_hidden=False)
    blocks.spec_rewind_cache(12)
    for k, token in enumerate(ids[12:]):
        one, _ = blocks.spec_forward([token], all_logits_rows=False, want_hidden=False)
        assert torch.equal(rows[k], one[0])  # the kernel path is batch-invariant
    assert torch.equal(blocks.embed([3, 7]), dense.embed([3, 7]))
    assert torch.allclose(blocks.lm_head(hidden[:2]), dense.lm_head(hidden[:2]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sampled", [False, True])
def test_speculative_generation_with_block_weights_is_lossless(tiny, sampled):
    """The default (block) weights under the shared loop: speculative output equals plain."""
    from gguf import GGMLQuantizationType as T

    from tsspec.runtime.sampling import SamplingParams
    from tsspec.testing import RandomSpeculator, assert_lossless
    from tsspec_model_llama import load_llama

    _, _, path = tiny(quantize={"*": T.Q4_1})
    sampling = SamplingParams(temperature=0.8, top_k=20, seed=3) if sampled else None
    assert_lossless(
        lambda: load_llama(path), lambda t: RandomSpeculator(300, max_draft_tokens=4, seed=1), prompt(5),
        max_tokens=24, sampling=sampling,
    )


def test_embedded_verify_rows_equal_decode_rows_bit_for_bit(embedded_target):
    """On the default CPU path (block weights, kernel attention) a k-row verify reproduces the
    1-row decode's logits exactly: speculation cannot even flip a near-tie."""
    from tsspec_gguf import native

    if not native.available():
        pytest.skip("the compiled CPU kernels were not built")
    target = embedded_target
    ids = target.tokenizer.encode("Rewrite: the quick brown fox jumps over the lazy dog, twice over.")
    target.reset()
    target.spec_forward(ids[:6], all_logits_rows=False, want_hidden=False)
    decode = [target.spec_forward([t], all_logits_rows=False, want_hidden=False)[0][0] for t in ids[6:]]
    target.spec_rewind_cache(6)
    verify, _ = target.spec_forward(ids[6:], all_logits_rows=True, want_hidden=False)
    target.reset()
    assert len(decode) >= 8
    for k, row in enumerate(decode):
        assert torch.equal(verify[k], row), k


def random_k_quant(rows: int, cols: int, kind, seed: int):
    """Random but well-scaled K-quant blocks [rows, bytes] (gguf has no K-quant encoder)."""
    import numpy as np
    from gguf import GGMLQuantizationType as T

    size, scale_at = {T.Q4_K: (144, (0, 2)), T.Q5_K: (176, (0, 2)), T.Q6_K: (210, (208,))}[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    for at in scale_at:  # d (and dmin): small positive fp16
        blocks[:, at : at + 2] = np.frombuffer(
            rng.uniform(0.0005, 0.004, len(blocks)).astype(np.float16).tobytes(), np.uint8
        ).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def test_k_quant_files_take_the_block_path_and_match_transformers(tmp_path):
    """A llama GGUF laid out like a Q4_K_M file (Q4_K, with Q6_K / Q5_K for V, down and the
    head) keeps every matrix as blocks; logits equal the dense path's and transformers'."""
    from gguf import GGMLQuantizationType as T

    from tsspec_gguf.gguf_writer import write_gguf
    from tsspec_gguf import native
    from tsspec_model_llama import load_llama
    from tsspec_model_llama.convert import llama_gguf_contents

    from .conftest import make_hf_llama

    if not native.available():
        pytest.skip("the block kernel was not built")
    model = make_hf_llama(0, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    metadata, tensors = llama_gguf_contents(model.config, model.state_dict())
    for i, (name, array) in enumerate(sorted(tensors.items())):
        if array.ndim == 2:
            kind = T.Q6_K if name in ("output.weight", "blk.0.attn_v.weight") else T.Q4_K
            kind = T.Q5_K if "ffn_down" in name else kind
            tensors[name] = (random_k_quant(array.shape[0], array.shape[1], kind, seed=i), kind)
    path = write_gguf(tmp_path / "kquant.gguf", "llama", metadata, tensors)
    blocks, dense = load_llama(path), load_llama(path, {"dtype": "float32"})
    from tsspec_gguf.qlinear import BlockMatrix

    assert blocks.config.extra["weights"] == "blocks"
    assert isinstance(blocks._lm_head, BlockMatrix) and blocks._lm_head.fmt == 16
    assert all(isinstance(getattr(layer, name), BlockMatrix) for layer in blocks._layers
               for name in ("wqkv", "wo", "w_gate_up", "w_down"))
    assert blocks._layers[0].wqkv.fmt == 16 and blocks._layers[1].wqkv.fmt == 4
    ids = prompt(12)
    got, _ = blocks.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    expected, _ = dense.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    assert_close(got, expected, tol=1e-5)
    assert_matches_transformers_on_the_file(path, ids, got)


def test_f16_matrices_stay_16_bit_blocks_and_a_type_without_blocks_is_named_in_one_warning(tiny, capsys):
    """F16 matrices run on the kernel at 16 bits, beside the file's other blocks (no warning); a
    type with no block form (here a Q2_K count) is named, with its count, in one line."""
    from gguf import GGMLQuantizationType as T
    from tsspec_model_llama.loader import warn_dense_matrices

    _, target, path = tiny(quantize={"attn_output": T.F16, "*": T.Q5_0})
    assert "warning" not in capsys.readouterr().err
    assert target.served_formats["F16"] == (2, 0) and target.served_formats["Q5_0"][1] == 0
    assert "F16 x2 blocks" in target.config.extra["weight_formats"]
    assert "F16 weights kept at 16 bits" in target.config.extra["weights"]
    line = warn_dense_matrices("m.gguf", {"F16": (2, 0), "Q2_K": (0, 3), "F32": (0, 4)})
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "3 matrix tensors (Q2_K x3)" in err and line in err
