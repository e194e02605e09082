"""Shared fixtures: tiny random Hugging Face Qwen 3.5 / 3.5-MoE / Qwen3-Next models (the oracle),
their GGUF conversions, and loaders for our targets.

Every config has num_k_heads != num_v_heads (so the V-head order matters), two GDN layers and two
full-attention layers. Weights are re-drawn after HF's init so that every RMSNorm weight is
non-zero (HF initialises them to 0, which would hide a missing +1 fold) and activations stay O(1).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

ARCHS = ("qwen35", "qwen35moe", "qwen3next")
VOCAB = 96
COMMON = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2,
    max_position_embeddings=256, rms_norm_eps=1e-6,
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|: the oracle tests' measure (tolerance 1e-4 in float32)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine run several times faster on one thread (parallel
    regions of microsecond ops spin against other processes); restored after each module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def rel_err():
    return _rel_err


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Re-draw every parameter: zero-centred (1 + w) norms get O(0.3) weights, the plain GDN
    output norm 1 + O(0.3), linear weights 1/sqrt(fan_in), decays in a useful range."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif "norm" in name:
                p.copy_(0.3 * noise)
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.3, 3.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * noise)
            elif "embed" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]))


def _hf_classes(arch: str):
    import transformers as t
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m35
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m35moe
    from transformers.models.qwen3_next import modeling_qwen3_next as mnext

    if arch == "qwen35":
        return (t.Qwen3_5TextConfig(intermediate_size=48, tie_word_embeddings=False, **COMMON),
                t.Qwen3_5ForCausalLM, m35.Qwen3_5DecoderLayer, m35.Qwen3_5RMSNorm)
    if arch == "qwen35moe":  # tied embeddings: the file has no output.weight
        return (t.Qwen3_5MoeTextConfig(tie_word_embeddings=True, **COMMON, **MOE),
                t.Qwen3_5MoeForCausalLM, m35moe.Qwen3_5MoeDecoderLayer, m35moe.Qwen3_5MoeRMSNorm)
    return (t.Qwen3NextConfig(intermediate_size=48, decoder_sparse_step=1, tie_word_embeddings=False, **COMMON, **MOE),
            t.Qwen3NextForCausalLM, mnext.Qwen3NextDecoderLayer, mnext.Qwen3NextRMSNorm)


class HFOracle:
    """A tiny HF model plus an HF ``MtpLayer`` built from the same decoder-layer class."""

    def __init__(self, arch: str, seed: int = 0):
        from transformers.modeling_layers import MtpLayer

        config, model_cls, layer_cls, norm_cls = _hf_classes(arch)
        config._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.arch = arch
        self.config = config
        self.model = model_cls(config).eval()
        randomize(self.model, seed + 1)
        mtp_config = copy.deepcopy(config)
        mtp_config.layer_types = ["full_attention"]
        mtp_config._attn_implementation = "eager"
        self.mtp = MtpLayer(mtp_config, layer_cls, norm_cls, 0, use_post_norm=True).eval()
        randomize(self.mtp, seed + 2)

    def state_dict(self, *, with_mtp: bool = True) -> dict[str, torch.Tensor]:
        """The model's weights, plus the MTP weights under the checkpoint's ``mtp.*`` names."""
        sd = dict(self.model.state_dict())
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        if with_mtp:
            rename = {"eh_proj.": "mtp.fc.", "enorm.": "mtp.pre_fc_norm_embedding.",
                      "hnorm.": "mtp.pre_fc_norm_hidden.", "post_norm.": "mtp.norm.", "mtp_block.": "mtp.layers.0."}
            for key, value in self.mtp.state_dict().items():
                prefix = next(p for p in rename if key.startswith(p))
                sd[rename[prefix] + key[len(prefix):]] = value
        return sd

    @torch.no_grad()
    def logits(self, ids) -> torch.Tensor:  # [T, V]
        return self.model(torch.tensor([list(ids)]), use_cache=False).logits[0]

    @torch.no_grad()
    def hidden(self, ids) -> torch.Tensor:  # [T, H] post final norm
        return self.model.model(torch.tensor([list(ids)]), use_cache=False).last_hidden_state[0]

    @torch.no_grad()
    def mtp_rows(self, ids) -> tuple[torch.Tensor, torch.Tensor]:
        """HF MTP over the whole sequence: row i feeds token i+1 (position i+1) with the trunk
        row i. Returns (logits [T-1, V], chained hidden [T-1, H])."""
        ids = list(ids)
        h = self.hidden(ids)[:-1]
        emb = self.model.model.embed_tokens(torch.tensor([ids[1:]]))
        n = len(ids) - 1
        pos = torch.arange(1, n + 1)[None]
        cos_sin = self.model.model.rotary_emb(emb, pos)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = self.mtp(emb, h[None], position_embeddings=cos_sin, attention_mask=mask, position_ids=pos, cache=None)
        return self.model.lm_head(out)[0], out[0]


@pytest.fixture(scope="session")
def oracle():
    """oracle(arch) -> HFOracle, built once per architecture."""
    cache: dict[str, HFOracle] = {}

    def get(arch: str) -> HFOracle:
        if arch not in cache:
            cache[arch] = HFOracle(arch)
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def converted(oracle):
    """converted(arch, with_mtp=True) -> (arch, metadata, tensors) from convert_state_dict."""
    from tsspec_model_qwen35.convert import convert_state_dict

    cache = {}

    def get(arch: str, with_mtp: bool = True):
        key = (arch, with_mtp)
        if key not in cache:
            o = oracle(arch)
            cache[key] = convert_state_dict(o.config, o.state_dict(with_mtp=with_mtp))
        return cache[key]

    return get


@pytest.fixture(scope="session")
def gguf_path(converted, tmp_path_factory):
    """gguf_path(arch) -> a GGUF file written by core's writer from the conversion."""
    from tsspec_gguf.gguf_writer import write_gguf

    cache = {}

    def get(arch: str) -> str:
        if arch not in cache:
            a, meta, tensors = converted(arch)
            path = tmp_path_factory.mktemp("gguf") / f"tiny-{arch}.gguf"
            cache[arch] = write_gguf(path, a, meta, tensors)
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def make_target(converted, gguf_path):
    """make_target(arch, *, from_file=False, dtype=None, per_row_snapshots=True, with_mtp=True, **load_options)."""
    from tsspec_model_qwen35.loader import load_from_source
    from tsspec_model_qwen35.source import MemorySource

    def make(arch: str = "qwen35", *, from_file: bool = False, dtype=None, per_row_snapshots: bool = True,
             with_mtp: bool = True, **options):
        if from_file:
            from tsspec_gguf.gguf_file import GGUFFile

            with GGUFFile(gguf_path(arch)) as gf:
                return load_from_source(gf, dtype=dtype, per_row_snapshots=per_row_snapshots,
                                        with_draft_head=with_mtp, **options)
        a, meta, tensors = converted(arch)
        return load_from_source(MemorySource(a, meta, tensors), dtype=dtype, per_row_snapshots=per_row_snapshots,
                                with_draft_head=with_mtp, **options)

    return make


@pytest.fixture(scope="session")
def sequence():
    """A fixed pseudo-random token sequence (70 ids: longer than one 64-row prefill chunk)."""
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (70,), generator=g).tolist()
