"""Gemma4Assistant against transformers' Gemma4AssistantForCausalLM, ordered embeddings on and
off: chained draft steps over the target's committed K/V, and after a partial accept (the
rejected rows' K/V are never read)."""

from __future__ import annotations

import pytest
import torch

from gemma4_oracle import float64_oracle
from tsspec.errors import ModelLoadError
from tsspec_model_gemma4.assistant import attach_assistant
from tsspec_model_gemma4.loader import load_gemma4

TOKENS = torch.randint(0, 128, (14,), generator=torch.Generator().manual_seed(5)).tolist()
LIMITS = {"float64": 1e-9, "float32": 1e-4}
STEPS = 3


def _reference(target_model, assistant_model, tokens, last: int):
    """transformers' candidate-generator chain (constant position P = len(tokens)), with the
    target's shared K/V sliced to the committed rows 0 .. P - 1: [STEPS] logits."""
    P = len(tokens)
    with float64_oracle(target_model, assistant_model), torch.no_grad():
        out = target_model(torch.tensor([tokens]), use_cache=False, output_hidden_states=True,
                           return_shared_kv_states=True)
        shared = {k: (v[0][:, :, :P], v[1][:, :, :P]) for k, v in out.shared_kv_states.items()}
        h, token, logits = out.hidden_states[-1][:, P - 1 : P], torch.tensor([[last]]), []
        for _ in range(STEPS):
            x = torch.cat([target_model.model.embed_tokens(token), h], dim=-1)
            o = assistant_model(inputs_embeds=x, position_ids=torch.tensor([[P]]), shared_kv_states=shared,
                                use_cache=False)
            logits.append(o.logits[0, 0])
            h, token = o.last_hidden_state, o.logits.argmax(-1)
    return logits


def _chain(head, token: int, h: torch.Tensor, position: int):
    logits = []
    for step in range(STEPS):
        out, h = head.draft_step(token, h, position + step)
        logits.append(out)
        token = int(out.argmax())
    return logits


def _rel(got, want) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


def _load(path, dtype):
    return load_gemma4(path, {"dtype": "float64"} if dtype == "float64" else None)


@pytest.mark.parametrize("dtype", sorted(LIMITS))
@pytest.mark.parametrize("name", ["assistant", "ordered"])
def test_draft_chain_matches_transformers(files, name, dtype):
    target_model, target_path = files["trunk"]
    assistant_model, path = files[name]
    target = _load(target_path, dtype)
    head = attach_assistant(target, path)
    _, hidden = target.spec_forward(TOKENS[:11], all_logits_rows=True, want_hidden=True)
    got = _chain(head, TOKENS[11], hidden[-1], 11)
    want = _reference(target_model, assistant_model, TOKENS[:11], TOKENS[11])
    for g, w in zip(got, want):
        assert _rel(g, w) <= LIMITS[dtype]
        assert int(g.argmax()) == int(w.argmax())


@pytest.mark.parametrize("name", ["assistant", "ordered"])
def test_after_a_partial_accept_the_rejected_rows_are_never_read(files, name):
    target_model, target_path = files["trunk"]
    assistant_model, path = files[name]
    target = _load(target_path, "float64")
    head = attach_assistant(target, path)
    target.spec_forward(TOKENS[:7], all_logits_rows=False, want_hidden=False)
    _, hidden = target.spec_forward(TOKENS[7:9] + [1, 2, 3], all_logits_rows=True, want_hidden=True)
    target.spec_keep(2)  # rows of 1, 2, 3 rejected: the next token goes to position 9
    with torch.inference_mode():  # the caches are inference tensors
        for cache in (*target._k.values(), *target._v.values()):
            cache[:, 9:] = float("nan")  # anything read past the committed rows would show
    got = _chain(head, TOKENS[9], hidden[1], 9)
    want = _reference(target_model, assistant_model, TOKENS[:9], TOKENS[9])
    for g, w in zip(got, want):
        assert torch.isfinite(g).all() and _rel(g, w) <= 1e-9


def test_an_assistant_for_another_target_is_refused(files, tmp_path):
    import gemma4_tiny as tiny

    _, target_path = files["trunk"]
    other = files["assistant"][0]  # its GGUF, rewritten for a 32-wide target
    meta, tensors = tiny.assistant_gguf(other.config.to_dict(), other.state_dict())
    meta["gemma4-assistant.embedding_length_out"] = 32
    tensors["nextn.pre_projection.weight"] = tensors["nextn.pre_projection.weight"][:, :64]
    tensors["nextn.post_projection.weight"] = tensors["nextn.post_projection.weight"][:32]
    path = tiny.write(tmp_path / "other.gguf", "gemma4-assistant", meta, tensors)
    with pytest.raises(ModelLoadError, match="embedding_length_out 32"):
        attach_assistant(_load(target_path, "float32"), path)
    with pytest.raises(ModelLoadError, match="gemma4 target only"):
        attach_assistant(object(), files["assistant"][1])
