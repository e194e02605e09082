"""The benchmark's prompt set: the shipped file, user files, documents from the stdlib, fitting."""

from __future__ import annotations

import inspect
import json
import textwrap

import pytest

from tsspec_bench.prompts import (
    PromptSetError,
    encode_case,
    load_prompt_set,
    read_document,
    select_cases,
    shipped_prompts_path,
)
from tsspec.testing import ToyTarget

SPEC_BENCH_CLASSES = {"chat", "rewrite", "summary", "qa", "math", "rag", "code-edit", "prose"}


def _write(tmp_path, records):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def test_the_shipped_set_covers_every_class_and_fills_its_documents():
    assert shipped_prompts_path().is_file()
    cases = load_prompt_set()
    assert {c.cls for c in cases} == SPEC_BENCH_CLASSES
    for case in cases:
        assert 1 <= case.max_tokens <= 128
        assert case.messages and case.chat
        text = " ".join(content for _, content in case.messages)
        assert "{doc" not in text  # every placeholder was filled
    code = next(c for c in cases if c.id == "code-edit-1")
    assert inspect.getsource(textwrap.indent) in code.messages[-1][1]
    multi_turn = next(c for c in cases if c.cls == "chat")
    assert [role for role, _ in multi_turn.messages].count("assistant") >= 1


def test_user_prompts_prompt_and_messages_forms(tmp_path):
    path = _write(tmp_path, [
        {"class": "mine", "prompt": "hello there", "max_tokens": 8},
        "# a comment line",
        {"id": "raw", "class": "mine", "prompt": "raw text", "chat": False, "max_tokens": 4},
        {"id": "m", "class": "other", "max_tokens": 5,
         "documents": [{"module": "textwrap", "object": "dedent", "part": "doc", "max_chars": 40}],
         "messages": [{"role": "user", "content": "Doc: {doc0}"}]},
    ])
    cases = load_prompt_set(path)
    assert [c.cls for c in cases] == ["mine", "mine", "other"]
    assert cases[0].messages == (("user", "hello there"),)
    assert cases[1].prompt == "raw text" and not cases[1].chat
    doc = cases[2].messages[0][1]
    assert doc.startswith("Doc: ") and len(doc) <= len("Doc: ") + 41
    assert select_cases(cases, ["mine"], 1) == [cases[0]]
    assert select_cases(cases, None, None) == cases
    with pytest.raises(PromptSetError, match="no prompt of class"):
        select_cases(cases, ["nope"], None)


@pytest.mark.parametrize("record, message", [
    ({"prompt": "x", "max_tokens": 3}, "'class' is required"),
    ({"class": "c", "prompt": "x"}, "max_tokens must be >= 1"),
    ({"class": "c", "max_tokens": 3}, "exactly one of"),
    ({"class": "c", "max_tokens": 3, "prompt": "x", "messages": []}, "exactly one of"),
    ({"class": "c", "max_tokens": 3, "messages": [{"content": "x"}]}, "'role'"),
    ({"class": "c", "max_tokens": 3, "prompt": "{doc0}", "documents": [{"module": "no_such_module_here"}]}, "cannot be imported"),
    ({"class": "c", "max_tokens": 3, "prompt": "x", "documents": [{"module": "json", "part": "neither"}]}, "part must be"),
])
def test_bad_prompt_files_name_the_line_and_the_problem(tmp_path, record, message):
    path = _write(tmp_path, [record])
    with pytest.raises(PromptSetError, match=message) as info:
        load_prompt_set(path)
    assert "prompts.jsonl:1" in str(info.value)


def test_bad_json_missing_file_and_duplicates(tmp_path):
    with pytest.raises(PromptSetError, match="not valid JSON"):
        load_prompt_set(_write(tmp_path, ["{not json"]))
    with pytest.raises(PromptSetError, match="cannot read"):
        load_prompt_set(tmp_path / "missing.jsonl")
    dup = {"id": "a", "class": "c", "prompt": "x", "max_tokens": 2}
    with pytest.raises(PromptSetError, match="duplicate"):
        load_prompt_set(_write(tmp_path, [dup, dup]))


def test_read_document_source_and_dotted_objects():
    assert "def dedent" in read_document({"module": "textwrap", "object": "dedent", "part": "source"})
    assert read_document({"module": "pathlib", "object": "Path.mkdir", "part": "doc"})
    with pytest.raises(ValueError, match="no attribute"):
        read_document({"module": "textwrap", "object": "nope"})


def test_encode_case_uses_the_chat_template_and_fits_the_context():
    target = ToyTarget(max_context=128)
    cases = load_prompt_set()
    enc = encode_case(target, cases[0])
    assert enc.max_tokens == min(cases[0].max_tokens, 128 // 4)
    assert len(enc.prompt_ids) + enc.max_tokens < 128
    assert enc.trimmed > 0
    # the tail is kept: the request is at the end of the prompt
    text = target.tokenizer.apply_chat_template(cases[0].message_dicts())
    full = target.tokenizer.encode(text, add_special_tokens=False)
    assert list(enc.prompt_ids) == full[enc.trimmed:]
