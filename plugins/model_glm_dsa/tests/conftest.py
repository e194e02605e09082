"""Shared fixtures: a tiny random transformers GLM 5.x (``GlmMoeDsaForCausalLM``, the oracle, run
token by token with its cache: its multi-row forward is not causal, see test_causality.py), a
NextN layer built from transformers' own GLM modules, the GGUF conversion, and loaders.

The config has dense and MoE layers (``first_k_dense_replace`` 1), two expert groups, full and
shared indexer layers, and ``index_topk`` 6 (so at 40 tokens the indexer really selects). The
indexer has 16 heads: with 2, ReLU zeros often tie at the top-k boundary and transformers'
``topk`` breaks ties in an unspecified order (ours picks the lower position, stably).
Weights are re-drawn after transformers' init (which zeroes the selection bias) so that every
path carries signal.
"""

from __future__ import annotations

import math

import pytest
import torch

VOCAB = 64
SEQ = 40
CONFIG = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
    qk_nope_head_dim=8, v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    n_group=2, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=True, first_k_dense_replace=1,
    index_n_heads=16, index_head_dim=16, index_topk=6, indexer_types=["full", "full", "shared", "full"],
    max_position_embeddings=128, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    rms_norm_eps=1e-6, tie_word_embeddings=False, num_nextn_predict_layers=1,
)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
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


def randomize(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if "inv_freq" in name:
                continue
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * noise)
            elif ("norm" in name and name.endswith("bias")):
                p.copy_(0.3 * noise)
            elif "norm" in name and p.dim() == 1:
                p.copy_(1.0 + 0.3 * noise)
            elif "embed" in name:
                p.copy_(noise)
            elif p.dim() >= 2:
                p.copy_(noise / math.sqrt(p.shape[-1]))
            else:
                p.copy_(0.3 * noise)


def hf_classes():
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as m

    return m


class HFOracle:
    """The tiny transformers model and a NextN layer made of transformers' own GLM modules (its
    decoder layer with ``index_topk`` above any length, so its attention is dense)."""

    def __init__(self, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
        import transformers as t

        m = hf_classes()
        config = t.GlmMoeDsaConfig(**{**CONFIG, **overrides})
        config._attn_implementation = "eager"
        config._experts_implementation = "eager"  # the grouped-mm kernel takes no float64
        torch.manual_seed(seed)
        self.config = config
        self.model = t.GlmMoeDsaForCausalLM(config).eval()
        randomize(self.model, seed + 1)
        self.model.to(dtype)
        mcfg = t.GlmMoeDsaConfig(**{**CONFIG, **overrides, "num_hidden_layers": 1, "first_k_dense_replace": 0,
                                    "indexer_types": ["full"], "index_topk": 4096})
        mcfg._attn_implementation = "eager"
        mcfg._experts_implementation = "eager"
        H = config.hidden_size
        self.nextn_config = mcfg
        self.nextn = torch.nn.ModuleDict(dict(
            layer=m.GlmMoeDsaDecoderLayer(mcfg, 0), eh_proj=torch.nn.Linear(2 * H, H, bias=False),
            enorm=m.GlmMoeDsaRMSNorm(H, config.rms_norm_eps), hnorm=m.GlmMoeDsaRMSNorm(H, config.rms_norm_eps),
            head_norm=m.GlmMoeDsaRMSNorm(H, config.rms_norm_eps),
        )).eval()
        randomize(self.nextn, seed + 2)
        self._decoded: dict[tuple, torch.Tensor] = {}

    def state_dict(self, *, with_nextn: bool = True) -> dict[str, torch.Tensor]:
        sd = {k: v for k, v in self.model.state_dict().items() if "inv_freq" not in k}
        if with_nextn:
            L = self.config.num_hidden_layers
            for key, value in self.nextn.state_dict().items():
                if key.startswith("layer."):
                    sd[f"model.layers.{L}.{key[len('layer.'):]}"] = value
                elif key.startswith("head_norm."):
                    sd[f"model.layers.{L}.shared_head.norm.weight"] = value
                else:
                    sd[f"model.layers.{L}.{key}"] = value
        return sd

    @torch.no_grad()
    def decode(self, ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-by-token cached decode (causal by construction): (logits [T, V], the
        post-final-norm hidden rows [T, H])."""
        key = tuple(int(i) for i in ids)
        if key not in self._decoded:
            from transformers.cache_utils import DynamicCache

            cache = DynamicCache(config=self.config)
            rows, hidden = [], []
            for t in key:
                out = self.model.model(torch.tensor([[t]]), cache=cache, use_cache=True)
                h = out.last_hidden_state[0, -1]
                hidden.append(h)
                rows.append(self.model.lm_head(h))
            self._decoded[key] = (torch.stack(rows), torch.stack(hidden))
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
    from tsspec_model_glm_dsa.convert import convert_state_dict

    return convert_state_dict(oracle.config, oracle.state_dict())


@pytest.fixture(scope="session")
def gguf_path(converted, tmp_path_factory):
    from tsspec_model_glm_dsa.convert import write

    arch, meta, tensors = converted
    path = tmp_path_factory.mktemp("gguf") / "tiny-glm-dsa.gguf"
    write(path, arch, meta, tensors)
    return str(path)


def _request(with_nextn: bool):
    from tsspec_model_glm_dsa.request import NextNRequest

    return NextNRequest(with_nextn, "" if with_nextn else "test: not asked for")


@pytest.fixture(scope="session")
def make_target(converted, gguf_path):
    """make_target(*, from_file=False, dtype=None, with_nextn=False)."""
    from tsspec_gguf.gguf_file import GGUFFile, MemorySource
    from tsspec_model_glm_dsa.loader import load_from_source

    def make(*, from_file: bool = False, dtype=None, with_nextn: bool = False):
        if from_file:
            with GGUFFile(gguf_path) as gf:
                return load_from_source(gf, dtype=dtype, request=_request(with_nextn))
        arch, meta, tensors = converted
        return load_from_source(MemorySource(arch, meta, tensors), dtype=dtype, request=_request(with_nextn))

    return make


@pytest.fixture(scope="session")
def make_tie_target():
    """A target whose indexer has 2 heads (exact ReLU-zero ties at the top-k boundary are
    common): make_tie_target(dtype=None)."""
    from tsspec_gguf.gguf_file import MemorySource
    from tsspec_model_glm_dsa.convert import convert_state_dict
    from tsspec_model_glm_dsa.loader import load_from_source

    o = HFOracle(seed=3, index_n_heads=2, index_topk=4)
    arch, meta, tensors = convert_state_dict(o.config, o.state_dict(with_nextn=False))
    return lambda dtype=None: load_from_source(MemorySource(arch, meta, tensors), dtype=dtype, request=_request(False))


@pytest.fixture(scope="session")
def sequence():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (SEQ,), generator=g).tolist()


class float64_oracle:
    """transformers' GLM modules compute RMSNorm, the router and the eager softmax in float32
    whatever the model's dtype; inside this context they keep the input dtype, so a float64
    model is float64 throughout (the indexer's scores stay float32: they only choose keys)."""

    def __enter__(self):
        m = hf_classes()
        self.saved = (m.GlmMoeDsaRMSNorm.forward, m.GlmMoeDsaTopkRouter.forward, m.eager_attention_forward)

        def norm(mod, x):
            return mod.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + mod.variance_epsilon))

        router = self.saved[1]

        def route(mod, x):
            keep = torch.Tensor.type
            torch.Tensor.type = lambda t, dtype=None, *a, **k: t if dtype is torch.float32 else keep(t, dtype, *a, **k)
            try:
                return router(mod, x)
            finally:
                torch.Tensor.type = keep

        eager = self.saved[2]

        def attend(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
            softmax = torch.nn.functional.softmax
            torch.nn.functional.softmax = lambda x, dim=None, dtype=None, **k: softmax(x, dim=dim)
            try:
                return eager(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
            finally:
                torch.nn.functional.softmax = softmax

        m.GlmMoeDsaRMSNorm.forward, m.GlmMoeDsaTopkRouter.forward, m.eager_attention_forward = norm, route, attend
        return self

    def __exit__(self, *exc):
        m = hf_classes()
        m.GlmMoeDsaRMSNorm.forward, m.GlmMoeDsaTopkRouter.forward, m.eager_attention_forward = self.saved


@pytest.fixture(scope="session")
def oracle64():
    """The same model in float64, decoded with float64 kept throughout: decode64(ids)."""
    with float64_oracle():
        o = HFOracle(dtype=torch.float64)

    def decode(ids):
        with float64_oracle():
            return o.decode(ids)

    return decode


@pytest.fixture(scope="session")
def make_oracle():
    """HFOracle(seed=0, dtype=float32, **config overrides)."""
    return HFOracle


@pytest.fixture(scope="session")
def long_sequence():
    return torch.randint(0, VOCAB, (48,), generator=torch.Generator().manual_seed(7)).tolist()


@pytest.fixture(scope="session")
def float64_oracle_context():
    return float64_oracle
