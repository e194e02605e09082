"""Reading DFlash files: keys, spellings, DFlash2 detection and clear errors."""

from __future__ import annotations

import pytest
import torch

from tsspec.errors import ModelLoadError
from tsspec_gguf.gguf_file import GGUFFile

from tsspec_block.config import config_from_gguf, ring_rows_for
from tsspec_block.weights import weights_from_gguf

BASE = dict(hidden_size=16, target_layers=[1, 2], mask_token_id=31, num_layers=2, block_size=6, sliding_window=8)


def _read(path):
    with GGUFFile(path) as gf:
        cfg = config_from_gguf(gf)
        return cfg, weights_from_gguf(gf, cfg)


def test_plain_dflash_file(tmp_path, drafter_file):
    cfg, w = _read(drafter_file(tmp_path / "d.gguf", **BASE))
    assert cfg.target_layers == (1, 2) and cfg.block_size == 6 and cfg.mask_token_id == 31
    assert cfg.feature_size == 32 and cfg.ring_rows == 32  # pad(8 + 6 + 1, 32)
    assert not cfg.has_conv and not cfg.has_selector
    assert len(w.layers) == 2 and w.selector is None and w.layers[0].attn_conv is None
    assert w.fc.shape == (16, 32) and w.fc.dtype == torch.float32


def test_dflash2_file_is_keyed_off_its_keys(tmp_path, drafter_file):
    cfg, w = _read(drafter_file(tmp_path / "d2.gguf", conv=(3, 4), selector=(4, 5), vocab_size=32,
                                logit_scale=0.25, softcap=10.0, **BASE))
    assert cfg.has_conv and cfg.conv_groups == 4 and cfg.has_selector
    assert cfg.logit_scale == 0.25 and cfg.logit_softcap == 10.0
    assert w.layers[1].ffn_conv.base.shape == (2, 3, 16) and w.layers[1].ffn_conv.proj.shape == (24, 16)
    assert w.selector.vocab_size == 32 and w.selector.rank == 4 and w.selector.top_k == 5


@pytest.mark.parametrize("prefix", ["dflash-draft.", "dflash-draft.dflash."])
def test_dflash_draft_spellings_are_accepted(tmp_path, drafter_file, prefix):
    cfg, _ = _read(drafter_file(tmp_path / "v.gguf", arch="dflash-draft", prefix=prefix, **BASE))
    assert cfg.architecture == "dflash-draft" and cfg.target_layers == (1, 2) and cfg.block_size == 6


def test_legacy_mask_key(tmp_path, drafter_file):
    cfg, _ = _read(drafter_file(tmp_path / "m.gguf", mask_key="dflash.mask_token_id", **BASE))
    assert cfg.mask_token_id == 31


def test_sliding_window_pattern_period(tmp_path, drafter_file):
    path = drafter_file(tmp_path / "p.gguf", extra={"dflash.attention.sliding_window_pattern": 2},
                        **{**BASE, "num_layers": 4})
    cfg, _ = _read(path)
    assert [cfg.layer_is_sliding(i) for i in range(4)] == [True, False, True, False]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(drop=("block_size",)), "dflash.block_size"),
        (dict(drop=("target_layers",)), "dflash.target_layers"),
        (dict(drop_tensors=("blk.1.attn_k.weight",)), "blk.1.attn_k.weight"),
        (dict(drop_tensors=("blk.0.attn_conv_proj.weight",), conv=(3, 4)), "DFlash2"),
        (dict(extra={"dflash.hyper_connection.count": 4}), "DSpark"),
        (dict(extra={"dflash.block_size": 1}), "at least 2"),
        (dict(conv=(3, 5)), "does not divide"),
        (dict(arch="llama", prefix="dflash."), "not a DFlash drafter"),
    ],
)
def test_bad_files_fail_with_one_clear_line(tmp_path, drafter_file, kwargs, message):
    path = drafter_file(tmp_path / "bad.gguf", **{**BASE, **kwargs})
    with pytest.raises(ModelLoadError) as info:
        _read(path)
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_ring_rows():
    assert ring_rows_for(2048, 16) == 2080
    assert ring_rows_for(1, 2) == 32
