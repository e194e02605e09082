"""Shared fixtures: a tiny random transformers DeepSeek V4 (the oracle, run token by token with its
cache: its multi-row forward is not causal, see the README), its GGUF conversion, an MTP block
built from transformers' own layer classes, and loaders for our target.

The config has every layer type (sliding, CSA with an indexer that selects: 24 compressed
entries for ``index_topk`` 3 at 48 tokens; HCA), hash-routed and learned MoE layers, two
hyper-connection streams, a YaRN compressed RoPE, and a SwiGLU limit low enough to clamp.
The indexer has 16 heads: with 2, ReLU zeros often tie at the top-k boundary
(``sum_h w_h relu(q_h . k)`` is exactly 0 for several entries) and transformers' ``topk`` breaks
ties in an unspecified order (ours picks the lower entry index, stably).
Weights are re-drawn after transformers' init (which zeroes sinks, gate biases, the hash table
and the position biases) so that every path carries signal.
"""

from __future__ import annotations

import math

import pytest
import torch

VOCAB = 64
SEQ = 48
LAYER_TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
               "compressed_sparse_attention", "heavily_compressed_attention"]
MLP_TYPES = ["hash_moe", "hash_moe", "moe", "moe", "moe"]
CONFIG = dict(
    vocab_size=VOCAB, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=len(LAYER_TYPES),
    num_attention_heads=4, num_key_value_heads=1, head_dim=16, q_lora_rank=24, partial_rotary_factor=0.5,
    num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1, routed_scaling_factor=1.5,
    max_position_embeddings=128, rope_theta=10000.0, compress_rope_theta=40000.0,
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                     "beta_fast": 32.0, "beta_slow": 1.0},
    layer_types=LAYER_TYPES, mlp_layer_types=MLP_TYPES,
    compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 8},
    hc_mult=2, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=1.5, sliding_window=8, o_groups=2,
    o_lora_rank=12, index_n_heads=16, index_head_dim=16, index_topk=3, num_nextn_predict_layers=1,
    rms_norm_eps=1e-6, tie_word_embeddings=False,
)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (the oracle tests' measure: < 1e-4 in float32)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def rel_err():
    return _rel_err


def randomize(module: torch.nn.Module, seed: int, vocab: int = VOCAB, experts: int = 4) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if "inv_freq" in name:
                continue
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("tid2eid"):
                p.copy_(torch.randint(0, experts, p.shape, generator=g))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * noise)
            elif "norm" in name and p.dim() == 1:
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("sinks"):
                p.copy_(noise)
            elif name.endswith("position_bias"):
                p.copy_(0.5 * noise)
            elif name.endswith(("hc.base", "hc_base", "hc_head_base")) or name.endswith(".base"):
                p.copy_(0.3 * noise)
            elif name.endswith(("hc.scale", "hc_scale", "hc_head_scale")) or name.endswith(".scale"):
                p.copy_(1.0 + 0.2 * noise)
            elif "embed" in name:
                p.copy_(noise)
            elif p.dim() >= 2:
                p.copy_(noise / math.sqrt(p.shape[-1]))
            else:
                p.copy_(0.3 * noise)


class HFOracle:
    """The tiny transformers model and an MTP block made of transformers' own V4 modules."""

    def __init__(self, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
        import transformers as t
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

        config = t.DeepseekV4Config(**{**CONFIG, **overrides})
        config._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.config = config
        self.m = m
        self.model = t.DeepseekV4ForCausalLM(config).eval()
        randomize(self.model, seed + 1)
        self.model.to(dtype)
        self.dtype = dtype
        # the MTP block: one sliding-window, learned-MoE V4 decoder layer plus its projections
        mcfg = t.DeepseekV4Config(**{**CONFIG, "num_hidden_layers": 1, "layer_types": ["sliding_attention"],
                                     "mlp_layer_types": ["moe"]})
        mcfg._attn_implementation = "eager"
        H = config.hidden_size
        self.mtp_config = mcfg
        self.mtp = torch.nn.ModuleDict(dict(
            layer=m.DeepseekV4DecoderLayer(mcfg, 0), e_proj=torch.nn.Linear(H, H, bias=False),
            h_proj=torch.nn.Linear(H, H, bias=False), enorm=m.DeepseekV4RMSNorm(H), hnorm=m.DeepseekV4RMSNorm(H),
            norm=m.DeepseekV4RMSNorm(H), hc_head=m.DeepseekV4HyperHead(mcfg),
        )).eval()
        randomize(self.mtp, seed + 2)
        self._decoded: dict[tuple, torch.Tensor] = {}

    def state_dict(self, *, with_mtp: bool = True) -> dict[str, torch.Tensor]:
        sd = {k: v for k, v in self.model.state_dict().items() if "inv_freq" not in k}
        if with_mtp:
            for key, value in self.mtp.state_dict().items():
                if "inv_freq" in key:
                    continue
                if key.startswith("layer."):
                    sd["mtp.0." + key[len("layer."):]] = value
                elif key.startswith("hc_head."):
                    sd["mtp.0.hc_head_" + key.split(".hc_")[1]] = value
                else:
                    sd["mtp.0." + key] = value
        return sd

    @torch.no_grad()
    def decode(self, ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-by-token cached decode (causal by construction): (logits [T, V], streams
        [T, hc, H] after the last layer)."""
        key = tuple(int(i) for i in ids)
        if key not in self._decoded:
            from transformers.cache_utils import DynamicCache

            cache = DynamicCache(config=self.config)
            captured = []
            hook = self.model.model.layers[-1].register_forward_hook(lambda mod, a, out: captured.append(out[0, 0]))
            rows = []
            try:
                for t in key:
                    out = self.model(torch.tensor([[t]]), cache=cache, use_cache=True)
                    rows.append(out.logits[0, -1])
            finally:
                hook.remove()
            self._decoded[key] = (torch.stack(rows), torch.stack(captured))
        return self._decoded[key]

    @torch.no_grad()
    def prefill(self, ids) -> torch.Tensor:
        """transformers' multi-row forward (logits [T, V]): NOT causal on this model."""
        return self.model(torch.tensor([list(ids)]), use_cache=False).logits[0]


@pytest.fixture(scope="session")
def oracle():
    return HFOracle()


@pytest.fixture(scope="session")
def converted(oracle):
    """(arch, metadata, tensors) of the oracle's weights (MTP included)."""
    from tsspec_model_deepseek_v4.convert import convert_state_dict

    return convert_state_dict(oracle.config, oracle.state_dict())


@pytest.fixture(scope="session")
def gguf_path(converted, tmp_path_factory):
    from tsspec_model_deepseek_v4.convert import _write
    from tsspec_gguf.gguf_writer_util import write_gguf

    arch, meta, tensors = converted
    path = tmp_path_factory.mktemp("gguf") / "tiny-deepseek4.gguf"
    _write(path, arch, meta, tensors, write_gguf)
    return str(path)


@pytest.fixture(scope="session")
def make_target(converted, gguf_path):
    """make_target(*, from_file=False, dtype=None, with_mtp=True)."""
    from tsspec_model_deepseek_v4.loader import load_from_source
    from tsspec_model_deepseek_v4.source import MemorySource

    def make(*, from_file: bool = False, dtype=None, with_mtp: bool = True):
        if from_file:
            from tsspec_gguf.gguf_file import GGUFFile

            with GGUFFile(gguf_path) as gf:
                return load_from_source(gf, dtype=dtype, with_draft_head=with_mtp)
        arch, meta, tensors = converted
        return load_from_source(MemorySource(arch, meta, tensors), dtype=dtype, with_draft_head=with_mtp)

    return make


@pytest.fixture(scope="session")
def make_tie_target():
    """A target whose indexer has 2 heads (exact ReLU-zero ties at the top-k boundary are
    common): make_tie_target(dtype=None)."""
    from tsspec_model_deepseek_v4.convert import convert_state_dict
    from tsspec_model_deepseek_v4.loader import load_from_source
    from tsspec_model_deepseek_v4.source import MemorySource

    o = HFOracle(seed=3, index_n_heads=2)
    arch, meta, tensors = convert_state_dict(o.config, o.state_dict(with_mtp=False))
    return lambda dtype=None: load_from_source(MemorySource(arch, meta, tensors), dtype=dtype)


@pytest.fixture(scope="session")
def sequence():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (SEQ,), generator=g).tolist()
