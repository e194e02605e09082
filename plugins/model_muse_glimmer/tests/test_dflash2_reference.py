"""DFlash2 (grouped dynamic conv + candidate selector) against the DFlash authors' reference,
PyPI ``dflash==0.1.0`` (``DFlash2DraftModel``, installed test-only with ``--no-deps``), on a tiny
random Qwen3 target: the drafter is converted through tsspec's converter, its taps land where
the reference reads them (``hidden_states[layer_id + 1]``, model-specs trap 3), and two rounds
of block proposals (greedy lattice walk) agree token for token, hidden rows to 1e-9."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from tsspec.protocols import ModelConfig
from tsspec.runtime.loading import LoadOptions

dflash_model = pytest.importorskip("dflash.model")
pytest.importorskip("tsspec_block")
pytestmark = pytest.mark.oracle

VOCAB, HIDDEN, BLOCK, MASK = 96, 64, 5, 95
HF_IDS = [0, 2]
EPS = 2.0**-20


class Qwen3View:
    """The drafter-facing surface of a SpeculativeTarget over an HF Qwen3 causal LM."""

    def __init__(self, model):
        self.model = model
        cfg = model.config
        self.config = ModelConfig("qwen3-oracle", cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, 256)
        self.draft_head = None
        self.taps = None

    def embed(self, ids):
        return F.embedding(torch.as_tensor(list(ids), dtype=torch.long), self.model.get_input_embeddings().weight)

    def lm_head(self, h):
        return self.model.lm_head(h.to(torch.float64))

    def spec_set_feature_taps(self, layers):
        self.taps = list(layers) if layers else None

    @property
    def spec_feature_size(self):
        return (len(self.taps) if self.taps else 1) * self.config.hidden_size

    def states(self, ids):
        with torch.no_grad():
            return self.model(torch.tensor([list(ids)]), output_hidden_states=True).hidden_states

    def features(self, ids):
        """[T, taps * H]: the residual ENTERING each tapped layer (HF hidden_states[tap])."""
        return torch.cat([s[0] for s in (self.states(ids)[t] for t in self.taps)], dim=-1)


def _float64_norms_and_rope(model, head_dim):
    def rotary(self, x, position_ids):
        inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        emb = torch.cat([position_ids[..., None].double() * inv] * 2, dim=-1)
        return emb.cos(), emb.sin()

    def norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    model.rotary_emb.forward = types.MethodType(rotary, model.rotary_emb)
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(norm, module)


def build_pair(seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    tcfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                       tie_word_embeddings=False)
    target = Qwen3ForCausalLM(tcfg).double().eval()
    with torch.no_grad():
        for p in target.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    dcfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=EPS, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False, num_target_layers=4,
        dflash_config={"target_layer_ids": HF_IDS, "block_size": BLOCK, "mask_token_id": MASK,
                       "conv_kernel_size": 3, "conv_group_size": 8, "selector_rank": 4, "selector_top_k": 6,
                       "output_multiplier": 0.5, "final_logit_softcapping": 4.0})
    dcfg._attn_implementation = "sdpa"
    drafter = dflash_model.DFlash2DraftModel(dcfg).double().eval()
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            value = (1.5 if "candidate_selector" in name else 0.3) * torch.randn_like(p)  # the pair term bites
            if name.endswith("norm.weight"):
                value += 1.0
            if name.endswith("base_kernel"):
                value[:, 0] += 1.0  # near-identity taps at offset 0
            p.copy_(value.float().double())  # float32-exact: the GGUF holds them exactly
    _float64_norms_and_rope(drafter, 16)
    return target, drafter


def _converted(drafter, path):
    """The drafter through tsspec's converter, from its on-disk layout (bare codebook names)."""
    from tsspec_block.converter import gguf_from_state_dict

    state = {k.removesuffix(".weight") if "codebook" in k else k: v for k, v in drafter.state_dict().items()}
    assert gguf_from_state_dict(state, drafter.config.to_dict(), path) == "z-lab"
    return path


def test_block_proposals_match_the_dflash_reference(tmp_path):
    from tsspec_block.attach import attach_dflash

    target, drafter = build_pair()
    view = Qwen3View(target)
    head = attach_dflash(view, str(_converted(drafter, tmp_path / "dflash2.gguf")), LoadOptions(dtype="float64"))
    assert head.use_conv and head.use_selector
    assert view.taps == [i + 1 for i in HF_IDS]  # the file's taps: the residual entering layer id + 1

    ids = [3, 17, 5, 9, 40, 2, 77, 12, 8, 1, 50, 33, 61]
    p = 9
    feats = view.features(ids)  # [T, 2H]
    reference_feats = dflash_model.extract_context_feature(view.states(ids), HF_IDS)[0]
    assert torch.equal(feats, reference_feats)  # trap 3: the same rows the reference reads

    cache = dflash_model._make_cache(drafter.config)

    def reference(context, first, anchor, position):
        noise = view.embed([anchor] + [MASK] * (BLOCK - 1))[None]
        with torch.no_grad():
            hidden = drafter(target_hidden=context[None], noise_embedding=noise,
                             position_ids=torch.arange(first, position + BLOCK)[None],
                             past_key_values=cache, use_cache=True)[:, 1 - BLOCK :]
            dflash_model._crop_to(cache, position)
            tokens, _, _ = drafter.propose(hidden, torch.tensor([anchor]), target.lm_head, 0.0)
            plain = drafter.compute_logits(hidden, target.lm_head).argmax(-1)
        assert tokens[0].tolist() != plain[0].tolist()  # the selector's pair term decides here
        return tokens[0].tolist(), hidden[0]

    # round 1: the prompt ids[:p] is the context, ids[p] the anchor
    want, want_hidden = reference(feats[:p], 0, ids[p], p)
    with torch.no_grad():
        head.draft_catch_up(ids[:p], torch.cat([torch.zeros_like(feats[:1]), feats[: p - 1]]), 0)
        got, confs = head.draft_block(ids[p], feats[p - 1], p, BLOCK - 1)
        assert torch.allclose(head.block_hidden(ids[p], p)[1:], want_hidden, atol=1e-9, rtol=0)
    assert got == want and all(0.0 < c <= 1.0 for c in confs)

    # round 2: the verify kept the anchor and two drafts; ids[p + 3] is the new anchor
    want2, want_hidden2 = reference(feats[p : p + 3], p, ids[p + 3], p + 3)
    with torch.no_grad():
        head.draft_catch_up(ids[p : p + 3], feats[p - 1 : p + 2], p)
        got2, _ = head.draft_block(ids[p + 3], feats[p + 2], p + 3, BLOCK - 1)
        assert torch.allclose(head.block_hidden(ids[p + 3], p + 3)[1:], want_hidden2, atol=1e-9, rtol=0)
    assert got2 == want2
