"""The CLI end to end (in-process): JSON outputs, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tsspec.cli.app import main


def run(capsys, *args):
    code = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("tsspec ")


def test_plugins_json(capsys):
    code, out, _ = run(capsys, "plugins", "--json")
    rows = json.loads(out)
    assert code == 0 and {"ngram"} <= {r["name"] for r in rows}
    assert set(rows[0]) == {"name", "package", "version", "hooks", "status", "reason"}


def test_list_speculators_json_with_model(capsys):
    code, out, _ = run(capsys, "list-speculators", "--model", "toy", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0
    assert set(next(iter(rows.values()))) == {"name", "plugin", "package", "version", "requires_draft_head",
                                               "description", "status", "code", "reason", "shipped_drafter"}
    assert rows["ngram"]["status"] == "serves"
    if "draft-head" in rows:
        assert rows["draft-head"]["code"] == "no_draft_head"


def test_generate_json_on_toy(capsys):
    code, out, _ = run(capsys, "generate", "--model", "toy", "-p", "abc abc abc abc", "-n", "12",
                       "--spec-type", "ngram", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["tokens"]) == 12 and data["speculator"] == "ngram"
    assert data["prompt_tokens"] == 15 and "accepted_tokens" in data["stats"]
    code, out2, _ = run(capsys, "generate", "--model", "toy", "-p", "abc abc abc abc", "-n", "12", "--no-spec", "--json")
    plain = json.loads(out2)
    assert plain["tokens"] == data["tokens"] and plain["speculator"] is None


def test_generate_declined_speculation_reports_reason(capsys):
    code, out, _ = run(capsys, "generate", "--model", "toy", "-p", "abc", "-n", "3", "--spec-type", "draft-head", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["tokens"]) == 3  # generation goes on, plain
    assert data["speculator"] is None and data["decline"]["code"] == "no_draft_head"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["generate", "--model", "toy", "-p", "a", "--spec-draft", "0"], "--spec-draft must be between 1 and 64"),
        (["generate", "--model", "toy", "-p", "a", "--temperature", "-1"], "temperature"),
        (["generate", "--model", "/nonexistent/model.gguf", "-p", "a"], "/nonexistent/model.gguf: no such file"),
        (["inspect", "/nonexistent/x.gguf"], "no such file"),
        (["--config", "/nonexistent/c.toml", "plugins"], "does not exist"),
    ],
)
def test_errors_are_one_line_exit_2(capsys, args, fragment):
    code, _, err = run(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tsspec: error:") and fragment in lines[0]


def test_not_a_gguf(capsys, tmp_path):
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("hello, not a model")
    code, _, err = run(capsys, "generate", "--model", str(bogus), "-p", "x")
    assert code == 2 and str(bogus) in err and len(err.strip().splitlines()) == 1


def test_tuning_flag_with_no_spec_warns(capsys):
    code, _, err = run(capsys, "generate", "--model", "toy", "-p", "ab", "-n", "2", "--no-spec", "--spec-draft", "4")
    assert code == 0 and "--spec-draft has no effect" in err


def test_inspect_embedded_model(capsys):
    from tsspec_gguf.embedded import embedded_model_path

    path = str(embedded_model_path())
    code, out, _ = run(capsys, "inspect", path, "--json")
    info = json.loads(out)
    assert code == 0 and info["architecture"] == "llama" and info["tensor_count"] == 272
    assert info["has_chat_template"] and info["carries_drafter"] is False
    assert info["weight_formats"]["Q4_1"] == "4-bit blocks" and info["weight_formats"]["F32"] == "float32"


def test_plugin_commands_cannot_replace_taken_names():
    import typer

    from tsspec.cli.app import _add_plugin_commands, build_app
    from tsspec.hookspecs import hookimpl
    from tsspec.plugins import PluginHost
    from tsspec.runtime.catalog import build_catalog

    class First:
        @hookimpl
        def tsspec_register_commands(self, app):
            group = typer.Typer(name="convert")
            group.command("a")(lambda: None)
            app.add_typer(group)

    class Second:
        @hookimpl
        def tsspec_register_commands(self, app):
            app.command("generate")(lambda: None)  # a core command
            group = typer.Typer(name="convert")
            app.add_typer(group)
            app.command("fresh")(lambda: None)

    host = PluginHost()
    host.register(First(), "a-first")
    host.register(Second(), "b-second")
    app = build_app()
    _add_plugin_commands(app, build_catalog(host, discover=False))
    names = [c.name for c in app.registered_commands] + [g.typer_instance.info.name for g in app.registered_groups]
    assert names.count("generate") == 1 and names.count("convert") == 1 and "fresh" in names


def test_generate_stats_name_the_weights_path(capsys):
    """--stats adds a [model] line: the operator can see whether the block kernels run."""
    from tsspec_gguf import native

    code, _, err = run(capsys, "generate", "-p", "The capital of France is", "-n", "4", "--stats")
    assert code == 0
    model_line = next(line for line in err.splitlines() if line.startswith("[model] "))
    assert model_line.startswith("[model] llama, cpu, float32, weights ")
    if native.available():
        assert "weights blocks, arithmetic float32, kernels " in model_line
        code, _, err = run(capsys, "generate", "-p", "The capital of France is", "-n", "4", "--stats", "--dtype", "int8")
        assert code == 0 and f"weights blocks, arithmetic int8 ({native.info()['int8']}), kernels " in err
    code, _, err = run(capsys, "generate", "-p", "The capital of France is", "-n", "4", "--stats", "--dtype", "float32")
    assert code == 0 and "[model] llama, cpu, float32, weights dense" in err


def test_inspect_unserved_architecture_names_no_plugin(capsys, tmp_path):
    import numpy as np

    from tsspec_gguf.gguf_writer import write_gguf

    path = tmp_path / "mystery.gguf"
    write_gguf(path, "mystery", {"mystery.block_count": 1}, {"w": np.zeros((2, 2), dtype=np.float32)})
    code, out, _ = run(capsys, "inspect", str(path), "--json")
    info = json.loads(out)
    assert code == 0 and info["kind"] == "unserved" and info["served_by"] is None
    assert "'mystery' is served by no" not in info["reason"] and "no loaded plugin serves" in info["reason"]


def test_a_config_that_leaves_out_the_serve_plugin_names_it(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("TSSPEC_PLUGINS", raising=False)
    monkeypatch.delenv("TSSPEC_DISABLE_PLUGINS", raising=False)
    allow = tmp_path / "allow.toml"
    allow.write_text('[plugins]\nenabled = ["ngram", "llama"]\n')
    code, _, err = run(capsys, "--config", str(allow), "serve", "--port", "1")
    assert code == 2 and "no command 'serve'" in err and "plugin 'serve'" in err and "blocked" in err
    assert "allow-list" in err and str(allow) in err and len(err.strip().splitlines()) == 1
    deny = tmp_path / "deny.toml"
    deny.write_text('[plugins]\ndisabled = ["serve"]\n')
    code, _, err = run(capsys, "--config", str(deny), "serve")
    assert code == 2 and "plugin 'serve'" in err and "disabled" in err


def test_command_word_skips_global_options():
    from tsspec.cli.app import _command_word

    assert _command_word(["--config", "x.toml", "--debug", "serve", "--port", "1"]) == "serve"
    assert _command_word(["--plugins", "a,b", "--disable-plugin", "c"]) is None


def test_threads_and_ctx_size(capsys):
    import torch

    before = torch.get_num_threads()
    try:
        code, out, err = run(capsys, "generate", "-t", "1", "-c", "64", "-p", "Hello", "-n", "4", "--no-spec")
        assert code == 0 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    code, _, err = run(capsys, "generate", "--ctx-size", "100000", "-p", "Hello", "-n", "4")
    assert code == 2 and "--ctx-size 100000 exceeds the model's context of 8192" in err
    code, _, err = run(capsys, "generate", "-c", "6", "-p", "one two three four five six seven", "-n", "4")
    assert code == 2 and "context holds 6" in err
    code, _, err = run(capsys, "generate", "-t", "0", "-p", "Hello", "-n", "4")
    assert code == 2 and "--threads must be >= 1" in err


def test_chat_keeps_the_conversation_in_the_template(capsys, monkeypatch):
    import io

    from tsspec.runtime import generation

    prompts = []
    real = generation.generate

    def recording(target, prompt, *args, **kwargs):
        prompts.append(target.tokenizer.decode(prompt))
        return real(target, prompt, *args, **kwargs)

    monkeypatch.setattr(generation, "generate", recording)
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2+2?\nAnd times 3?\n/exit\nnever read\n"))
    code, out, _ = run(capsys, "chat", "-n", "8", "--system", "Be brief.")
    assert code == 0 and len(prompts) == 2 and len(out.strip().splitlines()) >= 2
    first_reply = out.splitlines()[0].strip()
    assert "Be brief." in prompts[0] and "What is 2+2?" in prompts[0]
    assert first_reply in prompts[1] and prompts[1].rstrip().endswith("assistant") and "And times 3?" in prompts[1]


def test_list_speculators_says_a_shipped_drafter_serves(capsys):
    """On the embedded model an algorithm whose drafter a plugin ships reads as what a user who
    asks for it gets: it serves, with that drafter named; the bare target's decline is kept."""
    pytest.importorskip("tsspec_model_llama")
    from tsspec.errors import ModelLoadError
    from tsspec_gguf.embedded import embedded_model_path

    try:
        path = str(embedded_model_path())
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    code, out, _ = run(capsys, "list-speculators", "--model", path, "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    shipped = [r for r in rows.values() if r["shipped_drafter"]]
    if not shipped:
        pytest.skip("no drafter is shipped for the embedded model in this install")
    for r in shipped:
        assert r["status"] == "serves" and r["code"] is None
        assert r["without_shipped_drafter"]["code"] == "no_draft_head"
    assert rows["ngram"]["shipped_drafter"] is None and rows["ngram"]["status"] == "serves"
    code, text, _ = run(capsys, "list-speculators", "--model", path)
    assert code == 0
    for r in shipped:
        assert f"serves (shipped drafter: {Path(r['shipped_drafter']).name})" in text
