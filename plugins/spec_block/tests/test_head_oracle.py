"""The DFlash drafter against transformers' DFlash code (muse_glimmer_assistant + DFlashCache),
float64, on a tiny random target + drafter pair converted through the plugin's converter."""

from __future__ import annotations

import pytest
import torch

from tsspec.runtime.loading import LoadOptions

from tsspec_block.attach import attach_dflash
from tsspec_block.converter import gguf_from_state_dict
from tsspec_block.ops import logit_transform

pytestmark = pytest.mark.oracle

TOL = 1e-10
F64 = LoadOptions(dtype="float64")


def _zero_row(width):
    return torch.zeros(1, width, dtype=torch.float64)


@pytest.mark.parametrize("window", [64, 3])
def test_block_logits_match_transformers(tmp_path, oracle_pair, hf_view, hf_block, window):
    """Two drafting rounds as DFlashTokenCandidateGenerator runs them: prefill context, then three
    accepted tokens. A window of 3 makes the sliding mask cut into the context."""
    from transformers.cache_utils import DFlashCache

    target, assistant = oracle_pair(window=window)
    view = hf_view(target)
    path = tmp_path / "drafter.gguf"
    assert gguf_from_state_dict(assistant.state_dict(), assistant.config.to_dict(), path) == "muse_glimmer_assistant"
    head = attach_dflash(view, path, F64)
    assert view.taps == [1, 3]  # trap 3: HF ids [0, 2] are the residuals entering layers 1, 3
    assert view.draft_head is head

    ids = torch.randint(0, 60, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    feats = view.features(ids)  # [20, 2H]
    B = assistant.config.block_size
    cache = DFlashCache(config=assistant.config)
    cache.activate_past_recording()

    p = 12  # prefill committed ids[:12]; the anchor ids[12] sits at position 12
    ref = hf_block(assistant, view, cache, feats, (0, p), p, ids[p])
    head.draft_catch_up(ids[:p], torch.cat([_zero_row(feats.shape[1]), feats[: p - 1]]), 0)
    ref_logits = target.lm_head(ref[1:])
    with torch.no_grad():
        head._inject(p - 1, feats[p - 1 : p])  # the carry row, as draft_block does
        mine = head.block_logits(ids[p], p)
    assert torch.allclose(mine, ref_logits, atol=TOL, rtol=0)

    cache.crop(-B)  # the generator drops the block's K/V before the next round
    p2 = p + 3
    ref2 = hf_block(assistant, view, cache, feats, (p, p2), p2, ids[p2])
    with torch.no_grad():
        head.draft_catch_up(ids[p:p2], feats[p - 1 : p2 - 1], p)
        tokens, confs = head.draft_block(ids[p2], feats[p2 - 1], p2, B - 1)
        mine2 = head.block_logits(ids[p2], p2)
    ref2_logits = target.lm_head(ref2[1:])
    assert torch.allclose(mine2, ref2_logits, atol=TOL, rtol=0)
    assert tokens == ref2_logits.argmax(-1).tolist()
    probs = torch.softmax(ref2_logits, -1).max(-1).values
    assert confs == pytest.approx(probs.tolist(), abs=1e-9)


def _zlab_state(assistant, *, conv, selector, vocab, seed=3):
    """The assistant's weights in z-lab's layout, plus DFlash2 conv / selector tensors."""
    g = torch.Generator().manual_seed(seed)
    cfg = assistant.config
    H = cfg.hidden_size
    rename = {"encoder.fc.weight": "fc.weight", "encoder.output_norm_enc.weight": "hidden_norm.weight"}
    state = {rename.get(k, k): v for k, v in assistant.state_dict().items()}
    extra = {}
    if conv:
        K, gs = conv
        for i in range(cfg.num_hidden_layers):
            for side in ("attention_conv", "mlp_conv"):
                base = 0.3 * torch.randn(2, K, H, generator=g, dtype=torch.float64)
                base[:, 0] += 1.0
                state[f"layers.{i}.{side}.base_kernel"] = base.float().double()
                proj = 0.2 * torch.randn(2 * K * (H // gs), H, generator=g, dtype=torch.float64)
                state[f"layers.{i}.{side}.kernel_projection.weight"] = proj.float().double()
        extra.update(conv_kernel_size=K, conv_group_size=gs)
    if selector:
        r, k = selector
        state["candidate_selector.hidden_projection.weight"] = torch.randn(r, H, generator=g).double()
        state["candidate_selector.predecessor_codebook"] = torch.randn(vocab, r, generator=g).double()
        state["candidate_selector.successor_codebook"] = torch.randn(vocab, r, generator=g).double()
        extra.update(selector_rank=r, selector_top_k=k)
    config = cfg.to_dict()
    config["is_causal"] = False
    config["dflash_config"] = {
        "target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
        "block_size": cfg.block_size, "output_multiplier": 0.5, "final_logit_softcapping": 4.0, **extra,
    }
    for key in ("target_layer_ids", "mask_token_id", "block_size"):
        config.pop(key)
    return state, config


def _hook_conv(assistant, state, group_size, slow_conv):
    """Wrap each HF sublayer with the slow reference conv (side 0 on the normed input, side 1 on
    the sublayer output; coefficients from one projection of the input)."""
    K = None
    for i, layer in enumerate(assistant.layers):
        for norm, sub, name in ((layer.input_layernorm, layer.self_attn, "attention_conv"),
                                (layer.post_attention_layernorm, layer.mlp, "mlp_conv")):
            base = state[f"layers.{i}.{name}.base_kernel"]
            proj = state[f"layers.{i}.{name}.kernel_projection.weight"]
            K = base.shape[1]
            saved = {}

            def pre(module, args, out, base=base, proj=proj, saved=saved):
                h = out[0]  # [B, H]
                coef = (h @ proj.T).view(h.shape[0], 2, K, -1)
                saved["coef"] = coef[:, 1]
                return slow_conv(h, coef[:, 0], base[0], group_size)[None]

            def post(module, args, out, base=base, saved=saved):
                value = out[0] if isinstance(out, tuple) else out
                filtered = slow_conv(value[0], saved["coef"], base[1], group_size)[None]
                return (filtered, *out[1:]) if isinstance(out, tuple) else filtered

            norm.register_forward_hook(pre)
            sub.register_forward_hook(post)


@pytest.mark.parametrize("use_env", [False, True])
def test_dflash2_conv_and_selector_match_reference(tmp_path, oracle_pair, hf_view, hf_block, slow_refs,
                                                    monkeypatch, use_env):
    """A DFlash2 drafter (z-lab layout): transformers' blocks wrapped in the slow conv reference,
    then the slow selector walk on the transformed target logits. With the switches set to 0 the
    same file must run as plain DFlash."""
    from transformers.cache_utils import DFlashCache

    target, assistant = oracle_pair(seed=5, window=64, block=4, n_layers=1)
    vocab, gs = target.config.vocab_size, 8
    state, config = _zlab_state(assistant, conv=(3, gs), selector=(4, 5), vocab=vocab)
    path = tmp_path / "dflash2.gguf"
    assert gguf_from_state_dict(state, config, path) == "z-lab"
    if use_env:
        monkeypatch.setenv("TS_DFLASH_CONV", "0")
        monkeypatch.setenv("TS_DFLASH_SELECTOR", "0")
    view = hf_view(target)
    head = attach_dflash(view, path, F64)
    assert head.use_conv is not use_env and head.use_selector is not use_env
    if not use_env:
        _hook_conv(assistant, state, gs, slow_refs.conv)

    ids = torch.randint(0, 60, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    feats = view.features(ids)
    p = 9
    cache = DFlashCache(config=assistant.config)
    ref = hf_block(assistant, view, cache, feats, (0, p), p, ids[p])  # [B, H]
    with torch.no_grad():
        head.draft_catch_up(ids[:p], torch.cat([_zero_row(feats.shape[1]), feats[: p - 1]]), 0)
        tokens, confs = head.draft_block(ids[p], feats[p - 1], p, 3)
        hidden = head.block_hidden(ids[p], p)
    assert torch.allclose(hidden, ref, atol=TOL, rtol=0)
    logits = target.lm_head(ref[1:]).detach()
    if use_env:
        assert tokens == logits.argmax(-1).tolist()
        return
    transformed = logit_transform(logits, 0.5, 4.0)
    want_tokens, want_confs = slow_refs.select(
        transformed, ref[1:].detach(), ids[p],
        state["candidate_selector.hidden_projection.weight"],
        state["candidate_selector.predecessor_codebook"],
        state["candidate_selector.successor_codebook"], 5,
    )
    assert tokens == want_tokens
    assert confs == pytest.approx(want_confs, abs=1e-9)
