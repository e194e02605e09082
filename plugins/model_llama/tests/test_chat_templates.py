"""The families' built-in chat templates, used only when a file carries none."""

from __future__ import annotations

import pytest
from tsspec_gguf.tokenizer import GGUFTokenizer
from tsspec_model_llama.chat_templates import use_builtin_chat_template
from tsspec_model_llama.families import FAMILIES, family_of

CONVERSATION = [
    {"role": "system", "content": "Be brief. "},
    {"role": "user", "content": " What is 2+2?"},
    {"role": "assistant", "content": "4.\n"},
    {"role": "user", "content": "And times 3?"},
]
# Gemma's turn format: the system text joined to the first user turn, the assistant's role
# written "model", contents trimmed, the generation prompt opening a model turn
GEMMA_RENDERED = ("<bos><start_of_turn>user\nBe brief.\n\nWhat is 2+2?<end_of_turn>\n"
                  "<start_of_turn>model\n4.<end_of_turn>\n"
                  "<start_of_turn>user\nAnd times 3?<end_of_turn>\n"
                  "<start_of_turn>model\n")


def _tokenizer(template: str | None = None) -> GGUFTokenizer:
    """A tokenizer with Gemma's special tokens (rendering reads only their text)."""
    return GGUFTokenizer(None, tokens=["<pad>", "<eos>", "<bos>"], bos_token_id=2, eos_token_id=1,
                         eos_token_ids=[1], add_bos=True, add_eos=False, chat_template=template)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_a_gemma_file_without_a_template_gets_the_gemma_turns_and_one_note(arch, capsys):
    tokenizer = _tokenizer()
    assert not tokenizer.has_chat_template
    note = use_builtin_chat_template(tokenizer, family_of(arch), "model.gguf")
    assert note == "tsspec: note: model.gguf: no chat template in the file; using the gemma family's built-in one"
    assert tokenizer.has_chat_template and capsys.readouterr().err == ""  # printed when first used
    assert tokenizer.apply_chat_template(CONVERSATION) == GEMMA_RENDERED
    assert tokenizer.apply_chat_template(CONVERSATION[1:2], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n")
    assert capsys.readouterr().err == note + "\n"  # once, however many renders


def test_the_files_own_template_wins(capsys):
    tokenizer = _tokenizer("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    assert use_builtin_chat_template(tokenizer, family_of("gemma3"), "model.gguf") is None
    assert tokenizer.apply_chat_template(CONVERSATION[1:2], add_generation_prompt=False) == "[user] What is 2+2?"
    assert capsys.readouterr().err == ""


def test_a_family_without_a_built_in_keeps_the_clear_error():
    from tsspec_gguf.chat_template import ChatTemplateError

    tokenizer = _tokenizer()
    assert use_builtin_chat_template(tokenizer, family_of("llama"), "model.gguf") is None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tokenizer.apply_chat_template(CONVERSATION)
    assert use_builtin_chat_template(None, family_of("gemma3"), "model.gguf") is None  # ids-only file
    assert {f.architecture for f in FAMILIES.values() if f.builtin_chat_template} == {"gemma2", "gemma3"}
