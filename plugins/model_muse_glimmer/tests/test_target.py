"""The trunk against transformers' MuseGlimmerForConditionalGeneration (text part) on tiny random
configs, and the batch-invariance of the block-kernel path."""

from __future__ import annotations

import types

import pytest
import torch
from tsspec_gguf import native

from gguf import GGMLQuantizationType as Q

pytestmark = pytest.mark.oracle

REL = 1e-4  # float32
REL64 = 1e-9
IDS = [3, 17, 5, 9, 40, 2, 77, 12, 8, 1, 50, 33, 61, 7, 90, 25]


def rel_err(mine: torch.Tensor, ref: torch.Tensor) -> float:
    return ((mine.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def forward(target, ids):
    logits, _ = target.spec_forward(ids, all_logits_rows=True, want_hidden=False)
    return logits


# the block path needs the compiled kernels; without a C compiler the install falls back to dense
# torch weights (still checked against transformers, but neither blocks nor bit-exact by rows)
needs_kernels = pytest.mark.skipif(not native.available(), reason="the block kernel was not built")


def test_prefill_matches_transformers(tiny, helpers):
    model, target, _ = tiny()
    assert target.config.extra["weights"] == ("blocks" if native.available() else "dense")
    assert rel_err(forward(target, IDS), helpers.hf_logits(model, IDS)) < REL


def _float64_exact(model):
    """transformers computes RoPE angles and RMSNorm in float32 whatever the model dtype: swap in
    float64 versions of the same formulas so the float64 comparison is exact."""
    lm = model.model.language_model
    cfg = lm.config

    def rotary(self, x, position_ids):
        dim = cfg.head_dim
        inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        emb = torch.cat([position_ids[..., None].double() * inv] * 2, dim=-1)
        return emb.cos(), emb.sin()

    def norm_with(eps, centred):
        def norm(self, x):
            out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            weight = self._parameters.get("weight")
            if centred:
                return out * (1.0 + weight)
            return out if weight is None else out * weight

        return norm

    lm.config._attn_implementation = "sdpa"  # eager attention takes its softmax in float32
    lm.rotary_emb.forward = types.MethodType(rotary, lm.rotary_emb)
    for name, module in lm.named_modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm"):
            # each norm's epsilon from its own config field: the post-norms have their own
            eps = cfg.post_norm_eps if name.rsplit(".", 1)[-1].startswith("post_") else cfg.rms_norm_eps
            module.forward = types.MethodType(norm_with(eps, kind.endswith("CenteredRMSNorm")), module)
    return model.double()


def test_float64_matches_transformers(tiny, helpers):
    # float32-exact logit scale and QK factor: the GGUF keys are float32
    model, target, _ = tiny(dtype="float64", output_multiplier=0.25, qk_scale_factor=3.875)
    _float64_exact(model)
    with torch.no_grad():
        ref = model(torch.tensor([IDS])).logits[0]
    assert rel_err(forward(target, IDS), ref) < REL64


@pytest.mark.parametrize("prefill,rows,keep", [(8, 5, 5), (4, 6, 2), (9, 4, 1)])
def test_verify_on_cache_and_partial_acceptance(tiny, helpers, prefill, rows, keep):
    """Prefill, a multi-row verify (window 6: the rows straddle the window edge), keep ``keep``
    rows, then a new verify on the shortened cache: every row against transformers."""
    model, target, _ = tiny()
    forward(target, IDS[:prefill])
    verify = forward(target, IDS[prefill : prefill + rows])
    ref = helpers.hf_logits(model, IDS[: prefill + rows])
    assert rel_err(verify, ref[prefill:]) < REL
    target.spec_keep(keep)
    assert target.cache_seq_len == prefill + keep
    other = [11, 22, 33, 44, 55]
    seq = IDS[: prefill + keep] + other
    again = forward(target, other)
    assert rel_err(again, helpers.hf_logits(model, seq)[prefill + keep :]) < REL


def test_rewind_then_reforward(tiny, helpers):
    model, target, _ = tiny()
    forward(target, IDS)
    target.spec_rewind_cache(5)
    tail = [60, 61, 62, 63, 64, 65, 66, 67, 68]
    assert rel_err(forward(target, tail), helpers.hf_logits(model, IDS[:5] + tail)[5:]) < REL


@pytest.mark.parametrize("eps,post_eps", [(1e-2, 1e-1), (1e-6, 1e-8)])
def test_perturbed_norms_and_eps(tiny, helpers, eps, post_eps):
    """Norm weights far from 1 (so a missing +1 shows) and epsilons large enough to matter."""
    model, target, _ = tiny(seed=3, norm_std=0.8, rms_norm_eps=eps, post_norm_eps=post_eps)
    assert target.hparams.post_norm_eps == pytest.approx(post_eps)
    assert rel_err(forward(target, IDS), helpers.hf_logits(model, IDS)) < REL


def test_layer_pattern_other_than_three_to_one(tiny, helpers):
    types_ = ["full_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    thetas = [0 if t == "full_attention" else 10000.0 for t in types_]
    model, target, _ = tiny(seed=4, num_hidden_layers=5, layer_types=types_, layer_rope_theta=thetas, sliding_window=3)
    assert target.hparams.sliding == (False, True, True, False, True)
    forward(target, IDS[:5])
    verify = forward(target, IDS[5:12])
    assert rel_err(verify, helpers.hf_logits(model, IDS[:12])[5:]) < REL


def test_tight_softcap_and_unit_scale(tiny, helpers):
    """A softcap the logits actually reach (HF requires one: its config refuses None)."""
    model, target, _ = tiny(seed=5, final_logit_softcapping=1.5, output_multiplier=1.0)
    assert target.hparams.softcap == 1.5 and target.hparams.logit_scale == 1.0
    assert rel_err(forward(target, IDS), helpers.hf_logits(model, IDS)) < REL


def test_feature_taps_are_transformers_hidden_states(tiny):
    """Tap t is the residual entering layer t: HF ``hidden_states[t]`` (0: the normed embedding).
    HF's last entry is the final NORMED state, so the last tap (n_layers) is not compared."""
    model, target, _ = tiny()
    target.spec_set_feature_taps([0, 2, 3])
    _, hidden = target.spec_forward(IDS, all_logits_rows=True, want_hidden=True)
    with torch.no_grad():
        states = model(torch.tensor([IDS]), output_hidden_states=True).hidden_states
    ref = torch.cat([states[t][0] for t in (0, 2, 3)], dim=-1)
    assert hidden.shape == (len(IDS), 3 * 64)
    assert rel_err(hidden, ref) < REL


def _row_by_row(target, ids):
    rows = []
    for token in ids:
        logits, hidden = target.spec_forward([token], all_logits_rows=True, want_hidden=True)
        rows.append((logits, hidden))
    return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])


def random_k_quant(rows: int, cols: int, kind, seed: int):
    """Random, well-scaled K-quant blocks [rows, bytes] (gguf has no K-quant encoder)."""
    import numpy as np

    size, scale_at = {Q.Q4_K: (144, (0, 2)), Q.Q5_K: (176, (0, 2)), Q.Q6_K: (210, (208,))}[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    for at in scale_at:
        blocks[:, at : at + 2] = np.frombuffer(
            rng.uniform(0.0005, 0.004, len(blocks)).astype(np.float16).tobytes(), np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


class KQuant:
    """A ``quantize`` entry: K-quant blocks in place of the matrix (random, right shape)."""

    def __init__(self, kind):
        self.kind = kind


WIDE = dict(hidden_size=256, head_dim=64, intermediate_size=256)  # every K a multiple of 256
SCHEMES = {"f32": None, "q8_0": {"*": Q.Q8_0}, "q4_0": {"*": Q.Q4_0}, "q4_1 ffn + q8_0": {"ffn": Q.Q4_1, "*": Q.Q8_0}}


def k_quant_target(tmp_path, seed=0):
    """A Q4_K_M-like file: Q4_K matrices, Q6_K head and attn_v, Q5_K ffn_down (random blocks)."""
    from tsspec_gguf.gguf_writer_util import write_gguf
    from tsspec_model_muse_glimmer import load_muse_glimmer
    from tsspec_model_muse_glimmer.convert import muse_glimmer_gguf

    from .conftest import make_hf_muse

    model = make_hf_muse(seed, **WIDE)
    metadata, tensors = muse_glimmer_gguf(model.config.to_dict(), model.state_dict())
    for i, (name, array) in enumerate(sorted(tensors.items())):
        if array.ndim == 2:
            kind = Q.Q6_K if name == "output.weight" or "attn_v" in name else Q.Q5_K if "ffn_down" in name else Q.Q4_K
            tensors[name] = (random_k_quant(array.shape[0], array.shape[1], kind, seed=i), kind)
    path = write_gguf(tmp_path / "kquant.gguf", "muse-glimmer", metadata, tensors)
    return load_muse_glimmer(path), load_muse_glimmer(path, {"dtype": "float32"})


@needs_kernels
def test_k_quant_file_keeps_every_matrix_in_blocks(tmp_path):
    from tsspec_gguf.qlinear import BlockMatrix

    blocks, dense = k_quant_target(tmp_path)
    assert all(isinstance(getattr(layer, name), BlockMatrix) for layer in blocks._layers
               for name in ("wqkvg", "wo", "w_gate_up", "w_down"))
    assert isinstance(blocks._lm_head, BlockMatrix) and blocks._lm_head.fmt == 16
    assert rel_err(forward(blocks, IDS), forward(dense, IDS)) < 1e-5
    blocks.spec_rewind_cache(4)
    many = forward(blocks, IDS[4:])
    blocks.spec_rewind_cache(4)
    assert torch.equal(many, torch.cat([forward(blocks, [t]) for t in IDS[4:]]))


@needs_kernels
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_verify_rows_equal_decode_rows_bit_for_bit(tiny, scheme):
    """A k-row verify (crossing the window edge) reproduces 1-row decoding exactly, on every
    block format, logits and tapped hidden rows alike."""
    _, target, path = tiny(quantize=SCHEMES[scheme], **WIDE)
    from tsspec_model_muse_glimmer import load_muse_glimmer

    dense = load_muse_glimmer(path, {"dtype": "float32"})
    assert rel_err(forward(target, IDS), forward(dense, IDS)) < 1e-5  # blocks == dequantised
    target.reset()
    target.spec_set_feature_taps([1, 3])
    prefix, tail = IDS[:3], IDS[3:14]
    target.spec_forward(prefix, all_logits_rows=True, want_hidden=True)
    one_logits, one_hidden = _row_by_row(target, tail)
    target.spec_rewind_cache(len(prefix))
    many_logits, many_hidden = target.spec_forward(tail, all_logits_rows=True, want_hidden=True)
    assert torch.equal(one_logits, many_logits)
    assert torch.equal(one_hidden, many_hidden)


def test_context_overflow_is_a_generation_error(tiny):
    from tsspec.errors import GenerationError

    _, target, _ = tiny(max_position_embeddings=8)
    with pytest.raises(GenerationError, match="exceed"):
        forward(target, IDS[:9])


def test_long_prefill_past_the_kernel_row_limit(tiny, helpers):
    """100 rows: the matmuls take the dequantise + GEMM path (> 72 rows), the sliding layers
    attend row by row past the window; then a verify on that cache."""
    model, target, _ = tiny(sliding_window=16)
    ids = [(7 * i + 3) % 96 for i in range(106)]
    ref = helpers.hf_logits(model, ids)
    assert rel_err(forward(target, ids[:100]), ref[:100]) < REL
    assert rel_err(forward(target, ids[100:]), ref[100:]) < REL
