"""Every family against transformers on a tiny random config written as llama.cpp would write it:
prefill, cached decode, multi-row verify and rollback, sliding windows across their edge."""

from __future__ import annotations

import pytest
import torch

from tsspec_model_llama import load_llama
from tsspec_model_llama.convert import write_family_gguf

from .conftest import WEIGHT_STD

COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6)
WINDOW = 5  # sliding layers see 5 keys: every test sequence crosses the edge


def _hf(arch: str, seed: int = 0):
    """A random HF causal LM of ``arch`` with every weight drawn (norms around 1)."""
    import transformers as tf

    if arch == "qwen2":
        model_cls, config = tf.Qwen2ForCausalLM, tf.Qwen2Config(**COMMON, num_hidden_layers=2)
    elif arch == "qwen3":
        model_cls, config = tf.Qwen3ForCausalLM, tf.Qwen3Config(**COMMON, num_hidden_layers=2, tie_word_embeddings=True)
    elif arch == "phi3":
        model_cls = tf.Phi3ForCausalLM
        config = tf.Phi3Config(**COMMON, num_hidden_layers=2, pad_token_id=0,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    elif arch == "gemma2":
        model_cls = tf.Gemma2ForCausalLM
        config = tf.Gemma2Config(**COMMON, num_hidden_layers=4, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                 attn_logit_softcapping=5.0, final_logit_softcapping=3.0)
    else:
        model_cls = tf.Gemma3ForCausalLM
        config = tf.Gemma3TextConfig(**COMMON, num_hidden_layers=7, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                     rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                      "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        setattr(config, key, 0)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            offset = 1.0 if "norm" in name and not arch.startswith("gemma") else 0.0  # gemma norms apply 1 + w
            param.copy_(torch.randn_like(param) * WEIGHT_STD + offset)
            if "bias" in name:
                param.mul_(3)
    return model


FAMILIES = ["qwen2", "qwen3", "phi3", "gemma2", "gemma3"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(arch, hf model, gguf path)."""
    arch = request.param
    model = _hf(arch)
    path = write_family_gguf(tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch, model)
    return arch, model, path


def _hf_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()  # [rows, vocab]


IDS = [5, 77, 123, 9, 250, 31, 64, 199, 2, 140, 18, 260, 45, 88]


@pytest.mark.parametrize("dtype", [None, "float32", "float64"])
def test_prefill_decode_verify_rollback_match_transformers(family, dtype):
    arch, model, path = family
    target = load_llama(path, {"dtype": dtype})
    assert target.config.architecture == arch
    want = _hf_logits(model, IDS)
    tol = 2e-4 * float(want.abs().max())
    # prefill: every row
    got, _ = target.spec_forward(IDS, all_logits_rows=True, want_hidden=False)
    torch.testing.assert_close(got, want, atol=tol, rtol=0)
    # cached decode, one token at a time
    target.reset()
    target.spec_forward(IDS[:3], all_logits_rows=False, want_hidden=False)
    decoded = [target.spec_forward([t], all_logits_rows=True, want_hidden=False)[0][0] for t in IDS[3:]]
    torch.testing.assert_close(torch.stack(decoded), want[3:], atol=tol, rtol=0)
    # a multi-row verify crossing the window edge, then keep 2 rows and take another path
    target.reset()
    target.spec_forward(IDS[:4], all_logits_rows=False, want_hidden=False)
    verify, _ = target.spec_forward(IDS[4:10], all_logits_rows=True, want_hidden=False)
    torch.testing.assert_close(verify, want[4:10], atol=tol, rtol=0)
    if dtype is None:  # the kernel path: a verify row is the decode row bit for bit
        assert torch.equal(verify, torch.stack(decoded[1:7]))
    target.spec_keep(2)
    other = IDS[:6] + [11, 12, 13, 14, 15, 16]
    after, _ = target.spec_forward(other[6:], all_logits_rows=True, want_hidden=False)
    torch.testing.assert_close(after, _hf_logits(model, other)[6:], atol=tol, rtol=0)


def test_sliding_rollback_across_the_window_edge_is_bit_exact(family):
    """Drafts rejected past the window's edge leave nothing behind: the continuation's rows equal
    a fresh decode of the same tokens bit for bit (kernel path)."""
    arch, _, path = family
    target = load_llama(path)
    fresh = load_llama(path)
    seq = IDS + [3, 4, 5, 6, 7, 8]
    for stop in range(WINDOW - 2, WINDOW + 4):  # rollbacks either side of the edge
        target.reset()
        target.spec_forward(seq[:stop], all_logits_rows=False, want_hidden=False)
        target.spec_forward([290, 291, 292, 293, 294, 295, 296], all_logits_rows=True, want_hidden=False)
        target.spec_keep(1)  # keeps 290
        target.spec_rewind_cache(stop)  # and drops it too: the rejected draft is gone
        got, _ = target.spec_forward(seq[stop : stop + 6], all_logits_rows=True, want_hidden=False)
        fresh.reset()
        fresh.spec_forward(seq[:stop], all_logits_rows=False, want_hidden=False)
        rows = [fresh.spec_forward([t], all_logits_rows=True, want_hidden=False)[0][0] for t in seq[stop : stop + 6]]
        assert torch.equal(got, torch.stack(rows)), (arch, stop)


def test_family_facts_are_capability_fields(family):
    arch, _, path = family
    target = load_llama(path)
    fam = target.hparams.family
    assert fam.architecture == arch
    if arch.startswith("gemma"):
        assert fam.post_norms and fam.embedding_scale and fam.activation == "gelu_tanh"
        assert target.hparams.sliding_window == WINDOW
        assert [target.hparams.sliding(i) for i in range(target.hparams.n_layers)] == [
            i % fam.swa_period < fam.swa_period - 1 for i in range(target.hparams.n_layers)]
    assert fam.llama_block == (arch in ("qwen2", "phi3"))
    # llama's block runs on the fused native stack, the others (soft-capped ones aside) on the
    # step extension's family stack
    capped = bool(target.hparams.attn_softcap or target.hparams.final_softcap)
    assert (target._stack is not None) == (not capped)
    assert target._family_stack == (not fam.llama_block and not capped)


SPLITS = (3, 4, 1, 1, 6, 1, 4)  # a prefill, verifies and one-row decodes over len(IDS) + 6 tokens


@pytest.mark.parametrize("taps", [None, (0, 1, 2)], ids=["no-taps", "taps"])
def test_native_stack_equals_the_per_op_blocks(family, taps):
    """The one native call (every block, and without taps the whole step) gives the per-op
    path's logits and hidden rows bit for bit, sliding windows crossing their edge included."""
    arch, _, path = family
    target = load_llama(path)
    seq = IDS + [3, 4, 5, 6, 7, 8]
    out = {}
    for fused in (False, True):
        target.fused_blocks = fused
        target.spec_set_feature_taps(taps)
        target.reset()
        rows, at = [], 0
        for n in SPLITS:
            logits, hidden = target.spec_forward(seq[at : at + n], all_logits_rows=True, want_hidden=True)
            rows += [logits, hidden]
            at += n
        out[fused] = rows
    for k, (a, b) in enumerate(zip(out[True], out[False])):
        assert torch.equal(a, b), (arch, k, (a - b).abs().max().item())


def test_gelu_mul_matches_torch_and_its_own_scalar_tail():
    """The native GELU-tanh product: within float32 rounding of torch's float64 one (1 + tanh
    cancels for negative gates, as in torch's float32 formula: an absolute error of a few ulps
    of |g u|), and its vector lanes give the bits of its scalar tail."""
    import torch.nn.functional as F

    from tsspec_gguf import native

    step = native.extension("tsspec_model_llama._step_kernels")
    if step is None:
        pytest.skip("the step extension was not built")
    g = torch.Generator().manual_seed(0)
    f = 37  # four 8-lane vectors and a tail of 5
    gu = torch.randn((3, 2 * f), generator=g) * 4
    gu[0, :6] = torch.tensor([0.0, -0.0, 1e-6, -30.0, 30.0, -5.0])
    out = torch.empty((3, f))
    step.gelu_mul(gu.data_ptr(), out.data_ptr(), 3, f)
    want = F.gelu(gu[:, :f].double(), approximate="tanh") * gu[:, f:].double()
    scale = (gu[:, :f].abs() * gu[:, f:].abs()).double()
    assert bool(((out.double() - want).abs() <= 2e-6 * want.abs() + 2e-7 * scale).all())
    for j in range(8):  # lane j of the first vector against the same value in the scalar path
        one = torch.tensor([[gu[0, j].item(), gu[0, f + j].item()]])
        res = torch.empty((1, 1))
        step.gelu_mul(one.data_ptr(), res.data_ptr(), 1, 1)
        assert torch.equal(res[0, 0], out[0, j]), j


@pytest.mark.parametrize("sampled", [False, True])
def test_speculative_generation_is_lossless(family, sampled):
    """Plain and speculative decoding give the same tokens on each family's default path
    (blocks on the compiled kernels), greedy and seeded, with drafts rejected across the window
    edge."""
    from tsspec.runtime.sampling import SamplingParams
    from tsspec.testing import OracleSpeculator, RandomSpeculator, assert_lossless

    _, _, path = family
    sampling = SamplingParams(temperature=0.8, top_k=20, seed=3) if sampled else None
    prompt = IDS[:5]
    make = lambda: load_llama(path)  # noqa: E731
    for make_speculator in (
        lambda t: RandomSpeculator(300, max_draft_tokens=4, seed=1),
        lambda t: OracleSpeculator.from_plain_run(make(), prompt, 24, sampling=sampling, corrupt=0.3, seed=2),
    ):
        assert_lossless(make, make_speculator, prompt, max_tokens=24, sampling=sampling)


def _source(arch: str, layers: int, extra: dict | None = None, tensors: dict | None = None):
    import numpy as np

    from tsspec_gguf.gguf_file import MemorySource

    meta = {"block_count": layers, "embedding_length": 64, "feed_forward_length": 96, "attention.head_count": 4,
            "attention.head_count_kv": 2, "attention.key_length": 32, "attention.value_length": 32,
            "attention.layer_norm_rms_epsilon": 1e-6, "context_length": 128, **(extra or {})}
    return MemorySource(arch, {f"{arch}.{k}": v for k, v in meta.items()},
                        {"token_embd.weight": np.zeros((10, 64), np.float32), **(tensors or {})})


def test_gemma_27b_attention_scale_and_unsupported_rope_are_facts_of_the_file():
    """Without attention.scale, Gemma's 27B variants (46 / 62 blocks) scale by hidden / heads and
    the others by head_dim (llama.cpp's rule); long-context RoPE factors are refused by name."""
    import numpy as np

    from tsspec.errors import ModelLoadError
    from tsspec_model_llama.hparams import read_hparams

    assert read_hparams(_source("gemma2", 46)).q_scale == 16 ** -0.5
    assert read_hparams(_source("gemma2", 26)).q_scale == 32 ** -0.5
    assert read_hparams(_source("gemma3", 62)).q_scale == 16 ** -0.5
    assert read_hparams(_source("gemma3", 46)).q_scale == 32 ** -0.5
    assert read_hparams(_source("gemma2", 46, {"attention.scale": 0.25})).q_scale == 0.25
    with pytest.raises(ModelLoadError, match="long-context RoPE"):
        read_hparams(_source("phi3", 2, tensors={"rope_factors_long.weight": np.ones(16, np.float32)}))
