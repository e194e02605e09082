"""The two optional pieces of a NextN file: per-head q/k norms and a shared head (the target's
LM head): written, read back, refused by the compiled head, and drafting through the target."""

from __future__ import annotations

import pytest
import torch

from tsspec.testing import ToyTarget
from tsspec_draft_head import native_head
from tsspec_draft_head.nextn_file import QK_NORMS, TENSORS, read_nextn, write_nextn
from tsspec_draft_head.nextn_model import NextNConfig, NextNModule

V = 32


def _module(**cfg) -> NextNModule:
    module = NextNModule(NextNConfig(hidden_size=16, intermediate_size=24, num_heads=2, num_kv_heads=1, head_dim=8,
                                     **cfg), V)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return module


def test_qk_norms_and_a_shared_head_round_trip(tmp_path):
    import gguf

    module = _module(qk_norm=True)  # trained with its own copy of the target's rows ...
    module.draft_ids.copy_(torch.randperm(V))
    path = tmp_path / "h.gguf"
    write_nextn(path, module, target={"architecture": "llama", "vocab_size": V}, outtype="f32", shared_head=True)
    names = {t.name for t in gguf.GGUFReader(str(path)).tensors}
    assert set(QK_NORMS.values()) <= names and TENSORS["head"] not in names  # ... written without them
    back, facts, _ = read_nextn(str(path))
    assert back.cfg.qk_norm and back.cfg.shared_head and back.head.shape == (0, 16)
    assert back.draft_ids.tolist() == list(range(V)) and facts["vocab_size"] == V
    assert torch.equal(back.q_norm, module.q_norm) and torch.equal(back.wq, module.wq)
    assert native_head.layer_refusal(back) == "per-head q/k norms" and not native_head.available(back)


def test_a_shared_head_drafts_with_the_target_lm_head():
    module = _module(shared_head=True)
    with pytest.raises(ValueError, match="borrow_head"):
        module.logits(torch.zeros(16))
    target = ToyTarget()
    module.borrow_head(lambda rows: target.lm_head(rows).float())
    out = torch.randn(3, 16)
    assert torch.equal(module.logits(out), target.lm_head(out).float())
    with pytest.raises(ValueError, match="own rows"):
        _module().borrow_head(target.lm_head)


def test_a_shared_head_must_cover_the_whole_vocabulary(tmp_path):
    module = _module(draft_vocab=8)
    with pytest.raises(ValueError, match="whole vocabulary"):
        write_nextn(tmp_path / "h.gguf", module, target={"architecture": "llama", "vocab_size": V}, shared_head=True)
