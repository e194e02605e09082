"""Gemma4Target against transformers' Gemma4ForCausalLM (float64 oracle, tests/gemma4_oracle.py):
prefill, cached decode, multi-row verify, rollback after a partial accept; rows bit-exact."""

from __future__ import annotations

import pytest
import torch

from gemma4_oracle import float64_oracle
from tsspec.errors import ModelLoadError
from tsspec_model_gemma4.loader import load_gemma4

TOKENS = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(3)).tolist()
LIMITS = {"float64": 1e-9, "float32": 1e-4}


def _load(path, dtype):
    return load_gemma4(path, {"dtype": "float64"} if dtype == "float64" else None)


def _reference(model, tokens):
    """HF logits [n, V] and final hidden rows [n, H] of a full (causal) forward."""
    with float64_oracle(model), torch.no_grad():
        out = model(torch.tensor([tokens]), use_cache=False, output_hidden_states=True)
    return out.logits[0], out.hidden_states[-1][0]


def _rel(got, want) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("dtype", sorted(LIMITS))
@pytest.mark.parametrize("name", ["trunk", "moe"])
def test_prefill_decode_verify_match_transformers(files, name, dtype):
    model, path = files[name]
    ref, ref_hidden = _reference(model, TOKENS)
    target = _load(path, dtype)
    logits, hidden = target.spec_forward(TOKENS[:7], all_logits_rows=True, want_hidden=True)  # prefill
    rows = [logits]
    for t in TOKENS[7:9]:  # cached decode, one row at a time
        rows.append(target.spec_forward([t], all_logits_rows=False, want_hidden=False)[0])
    rows.append(target.spec_forward(TOKENS[9:], all_logits_rows=True, want_hidden=False)[0])  # 7-row verify
    assert _rel(torch.cat(rows), ref) <= LIMITS[dtype]
    assert _rel(hidden, ref_hidden[:7]) <= LIMITS[dtype]


@pytest.mark.parametrize("dtype", sorted(LIMITS))
def test_rollback_after_partial_accept(files, dtype):
    model, path = files["trunk"]
    ref, _ = _reference(model, TOKENS)
    target = _load(path, dtype)
    target.spec_forward(TOKENS[:6], all_logits_rows=False, want_hidden=False)
    wrong = [TOKENS[6], TOKENS[7], (TOKENS[8] + 1) % 128, 5, 6]  # two land, then rejected rows
    target.spec_forward(wrong, all_logits_rows=True, want_hidden=False)
    target.spec_keep(2)
    assert target.cache_seq_len == 8
    logits, _ = target.spec_forward(TOKENS[8:], all_logits_rows=True, want_hidden=False)
    assert _rel(logits, ref[8:]) <= LIMITS[dtype]


def test_verify_rows_equal_decode_rows_bit_for_bit(files):
    """float32: a k-row verify across the sliding window's edge, and again after a rollback,
    gives exactly the rows of one-token decodes (KV-shared layers and both head dims on)."""
    _, path = files["trunk"]
    decode, verify = _load(path, "float32"), _load(path, "float32")
    decode.spec_forward(TOKENS[:3], all_logits_rows=False, want_hidden=False)
    verify.spec_forward(TOKENS[:3], all_logits_rows=False, want_hidden=False)
    one = [decode.spec_forward([t], all_logits_rows=True, want_hidden=True) for t in TOKENS[3:9]]
    many = verify.spec_forward(TOKENS[3:9], all_logits_rows=True, want_hidden=True)
    assert torch.equal(torch.cat([o[0] for o in one]), many[0])
    assert torch.equal(torch.cat([o[1] for o in one]), many[1])
    verify.spec_forward([1, 2, 3, 4], all_logits_rows=True, want_hidden=False)
    verify.spec_keep(1)
    decode.spec_forward([1], all_logits_rows=True, want_hidden=False)
    again = verify.spec_forward(TOKENS[9:14], all_logits_rows=True, want_hidden=False)[0]
    one = torch.cat([decode.spec_forward([t], all_logits_rows=True, want_hidden=False)[0] for t in TOKENS[9:14]])
    assert torch.equal(one, again)


def test_a_growing_cache_keeps_its_rows(files, monkeypatch):
    import tsspec_model_gemma4.target as module

    _, path = files["trunk"]
    whole = _load(path, "float64").spec_forward(TOKENS, all_logits_rows=True, want_hidden=False)[0]
    monkeypatch.setattr(module, "INITIAL_CAPACITY", 2)
    target = _load(path, "float64")
    parts = [target.spec_forward(TOKENS[a:b], all_logits_rows=True, want_hidden=False)[0]
             for a, b in ((0, 3), (3, 4), (4, 9), (9, 16))]  # capacity 3, 6, 12, 24
    assert torch.equal(torch.cat(parts), whole)  # row-invariant: the same rows, grown or not


def test_bad_files_are_one_line_errors_naming_the_problem(files, tmp_path):
    import gemma4_tiny as tiny

    model, _ = files["trunk"]
    meta, tensors = tiny.gemma4_gguf(model.config.to_dict(), model.state_dict())
    broken = dict(meta)
    del broken["gemma4.attention.sliding_window_pattern"]
    with pytest.raises(ModelLoadError, match="sliding_window_pattern must hold one bool per layer"):
        load_gemma4(tiny.write(tmp_path / "a.gguf", "gemma4", broken, tensors))
    extra = dict(tensors, **{"blk.6.attn_k.weight": tensors["blk.2.attn_k.weight"]})
    with pytest.raises(ModelLoadError, match="layer 6 is KV-shared but the file carries its attn_k"):
        load_gemma4(tiny.write(tmp_path / "b.gguf", "gemma4", meta, extra))
    missing = {k: v for k, v in tensors.items() if k != "blk.3.ffn_up.weight"}
    with pytest.raises(ModelLoadError, match="blk.3.ffn_up.weight"):
        load_gemma4(tiny.write(tmp_path / "c.gguf", "gemma4", meta, missing))


def test_a_gemma4_vocabulary_loads_for_token_ids_with_a_warning(files, tmp_path, caplog):
    import gemma4_tiny as tiny

    model, _ = files["trunk"]
    meta, tensors = tiny.gemma4_gguf(model.config.to_dict(), model.state_dict())
    meta.update({"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": [f"t{i}" for i in range(128)]})
    target = load_gemma4(tiny.write(tmp_path / "v.gguf", "gemma4", meta, tensors))
    assert target.tokenizer is None
    assert "tokenizer model 'gemma4' is not supported" in caplog.text


def test_files_that_are_not_gemma4_trunks_are_named(files):
    with pytest.raises(ModelLoadError, match="is not 'gemma4'"):
        load_gemma4(files["assistant"][1])
    with pytest.raises(ModelLoadError, match="--dtype"):
        load_gemma4(files["trunk"][1], {"dtype": "int4"})
