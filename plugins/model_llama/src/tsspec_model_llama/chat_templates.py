"""Built-in chat templates: the turn format a family's instruction-tuned models were trained on,
for files that carry no ``tokenizer.chat_template`` (llama.cpp keeps such built-ins too, chosen by
family). A family names one in its ``builtin_chat_template`` field; the loader gives it to a
tokenizer without a template of its own, and the tokenizer prints the note the first time it
renders a conversation with it. A template in the file always wins.

Gemma: ``<start_of_turn>user\\n...<end_of_turn>\\n`` per turn, the assistant's role written
``model``, a system message joined to the first user turn (Gemma has no system role), contents
trimmed, and ``<start_of_turn>model\\n`` as the generation prompt, after the BOS token.
"""

from __future__ import annotations

GEMMA = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = (messages[0]['content'] | trim) ~ '\\n\\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set prefix = '' -%}"
    "{%- set turns = messages -%}"
    "{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' ~ role ~ '\\n' ~ (prefix if loop.first else '') ~ (message['content'] | trim)"
    " ~ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

BUILTIN: dict[str, str] = {"gemma": GEMMA}


def use_builtin_chat_template(tokenizer, family, path: str) -> str | None:
    """Give ``tokenizer`` (from ``path``) its family's built-in template when the file has none.
    Returns the note the tokenizer prints on first use (None: the file's own template, no
    built-in for the family, or no tokenizer)."""
    name = family.builtin_chat_template
    if tokenizer is None or name is None or tokenizer.has_chat_template:
        return None
    note = (f"tsspec: note: {path}: no chat template in the file; using the {name} family's built-in one")
    tokenizer.use_builtin_chat_template(BUILTIN[name], note)
    return note
