"""CLI input: every bad flag, environment value, prompt or config file gets a clear one-line
error and exit code 2 (no traceback); an unknown --spec-type lists the known names; tuning flags
with --no-spec print a warning and the output is plain decoding's.

``tsspec`` runs in-process (``tsspec.cli.app.main``) on the exact toy model (``--model toy``),
so each case takes milliseconds; one case runs the real executable as a subprocess.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from tsspec.testing import ToyTarget, plain_tokens

TOY_CONTEXT = 512  # ToyTarget's max_context
PROMPT = "the cat sat on the mat. the cat sat on the hat."
N = 12



@pytest.fixture
def cli(monkeypatch, tmp_path, capsys, cli_state):
    """run(*argv, stdin=None) -> (exit code, stdout, stderr); global state restored after and
    no config file of the machine's user is read."""
    from tsspec.cli import app as cli_app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user-config"))

    def run(*argv, stdin: bytes | None = None, tty: bool = False):
        if stdin is not None or tty:
            monkeypatch.setattr(sys, "stdin", _Stdin(stdin or b"", tty))
        capsys.readouterr()
        try:
            cli_app.main([str(a) for a in argv])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    return run


class _Stdin(io.TextIOWrapper):
    def __init__(self, data: bytes, tty: bool):
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def _plain_text(prompt: str = PROMPT, n: int = N) -> str:
    target = ToyTarget(seed=0)  # what --model toy loads
    ids = target.tokenizer.encode(prompt)
    return target.tokenizer.decode(plain_tokens(target, ids, n))


def assert_usage_error(code: int, out: str, err: str, *phrases: str) -> str:
    """Exit 2, nothing on stdout, one line on stderr naming the problem, no traceback."""
    assert code == 2, (code, err)
    assert out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tsspec: error: "), err
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])
    assert "Traceback" not in err
    return lines[0]


# -- flags out of range or in conflict ---------------------------------------------------------

BAD_FLAGS = {
    "--spec-draft 0": (["--spec-draft", "0"], "--spec-draft must be between 1 and 64"),
    "--spec-draft 65": (["--spec-draft", "65"], "--spec-draft must be between 1 and 64"),
    "--mtp-draft 0 (historical spelling)": (["--mtp-draft", "0"], "--spec-draft"),
    "--spec-pmin 2": (["--spec-pmin", "2"], "--spec-pmin must be between 0 and 1"),
    "--spec-pmin -0.1": (["--spec-pmin", "-0.1"], "--spec-pmin"),
    "--spec-pmin nan": (["--spec-pmin", "nan"], "--spec-pmin"),
    "--temperature -1": (["--temperature", "-1"], "--temperature"),
    "--temperature nan": (["--temperature", "nan"], "--temperature"),
    "--temperature inf": (["--temperature", "inf"], "--temperature"),
    "--top-p 1.5": (["--top-p", "1.5"], "--top-p"),
    "--top-p nan": (["--top-p", "nan"], "--top-p"),
    "--min-p -0.5": (["--min-p", "-0.5"], "--min-p"),
    "--top-k -1": (["--top-k", "-1"], "--top-k"),
    "--repeat-penalty 0": (["--repeat-penalty", "0"], "--repeat-penalty"),
    "--repeat-penalty nan": (["--repeat-penalty", "nan"], "--repeat-penalty"),
    "two different drafter files": (["--draft-model", "a.gguf", "--spec-draft-model", "b.gguf"],
                                    "conflict"),
    "--prompt and --prompt-file": (["--prompt-file", "p.txt"], "not both"),
    "--model toy:abc": (["--model", "toy:abc"], "toy:SEED"),
    "--model missing file": (["--model", "absent.gguf"], "absent.gguf: no such file"),
    "--model a directory": (["--model", "."], "directory"),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_bad_flags_are_one_line_errors(case, cli, tmp_path):
    extra, phrase = BAD_FLAGS[case]
    (tmp_path / "p.txt").write_text("from a file")
    argv = ["generate", "-p", PROMPT, "-n", N]
    if "--model" not in extra:
        argv += ["--model", "toy"]
    assert_usage_error(*cli(*argv, *extra), phrase)


CLICK_ERRORS = {  # rejected by the argument parser itself: exit 2, the option named
    "--max-tokens 0": (["--max-tokens", "0"], "--max-tokens"),
    "--spec-draft abc": (["--spec-draft", "abc"], "--spec-draft"),
    "--temperature warm": (["--temperature", "warm"], "--temperature"),
    "unknown flag": (["--spec-drafts", "4"], "--spec-drafts"),
}


@pytest.mark.parametrize("case", sorted(CLICK_ERRORS))
def test_parser_errors_exit_2_without_traceback(case, cli):
    extra, phrase = CLICK_ERRORS[case]
    code, out, err = cli("generate", "--model", "toy", "-p", PROMPT, *extra)
    assert code == 2 and out == "" and phrase in err and "Traceback" not in err


ENV_ERRORS = {
    "TS_SPEC_DRAFT=abc": ("TS_SPEC_DRAFT", "abc", "TS_SPEC_DRAFT='abc' is not an integer"),
    "TS_MTP_PMIN=2": ("TS_MTP_PMIN", "2", "--spec-pmin must be between 0 and 1"),
    "TS_SPEC_SPEC=maybe": ("TS_SPEC_SPEC", "maybe", "is not a boolean"),
    "TS_SPEC_TYPE=bogus": ("TS_SPEC_TYPE", "bogus", "unknown --spec-type 'bogus'"),
}


@pytest.mark.parametrize("case", sorted(ENV_ERRORS))
def test_bad_environment_values(case, cli, monkeypatch):
    name, value, phrase = ENV_ERRORS[case]
    monkeypatch.setenv(name, value)
    assert_usage_error(*cli("generate", "--model", "toy", "-p", PROMPT, "-n", N), phrase)


# -- --spec-type -------------------------------------------------------------------------------


def test_unknown_spec_type_lists_the_known_names(cli):
    from tsspec.cli.state import STATE

    line = assert_usage_error(*cli("generate", "--model", "toy", "-p", PROMPT, "--spec-type", "ngarm"),
                              "unknown --spec-type 'ngarm'", "known: auto")
    for name in STATE.catalog.speculators.names():
        assert name in line


def test_unknown_spec_type_with_no_spec_is_only_a_warning(cli):
    code, out, err = cli("generate", "--model", "toy", "-p", PROMPT, "-n", N, "--no-spec", "--spec-type", "ngarm")
    assert code == 0 and out == _plain_text() + "\n"
    assert "warning: --spec-type has no effect with speculation off" in err


def test_known_algorithm_that_cannot_serve_falls_back_with_the_reason(cli):
    """draft-head is known but the toy carries no head: a decline line, plain output, exit 0."""
    from tsspec.cli.state import STATE

    code, out, err = cli("generate", "--model", "toy", "-p", PROMPT, "-n", N, "--spec-type", "draft-head")
    if "draft-head" not in STATE.catalog.speculators.names():
        pytest.skip("the draft-head plugin is not installed")
    assert code == 0 and out == _plain_text() + "\n"
    assert "[speculation off] no_draft_head" in err


# -- prompts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["flag", "blank flag", "stdin", "file"])
def test_empty_prompt(how, cli, tmp_path):
    argv = ["generate", "--model", "toy", "-n", N]
    stdin = None
    if how == "flag":
        argv += ["-p", ""]
    elif how == "blank flag":
        argv += ["-p", "  \n\t "]
    elif how == "stdin":
        stdin = b""
    else:
        (tmp_path / "empty.txt").write_bytes(b"")
        argv += ["--prompt-file", tmp_path / "empty.txt"]
    assert_usage_error(*cli(*argv, stdin=stdin), "the prompt is empty")


def test_no_prompt_at_a_terminal(cli):
    assert_usage_error(*cli("generate", "--model", "toy", tty=True), "no prompt")


@pytest.mark.parametrize("via", ["flag", "file"])
def test_prompt_longer_than_the_context(via, cli, tmp_path):
    long_prompt = "abc " * 150  # 600 toy tokens, one per character
    argv = ["generate", "--model", "toy", "-n", N]
    if via == "flag":
        argv += ["-p", long_prompt]
    else:
        (tmp_path / "long.txt").write_text(long_prompt)
        argv += ["--prompt-file", tmp_path / "long.txt"]
    assert_usage_error(*cli(*argv), f"the prompt has {len(long_prompt)} tokens and the context holds {TOY_CONTEXT}")


@pytest.mark.parametrize("spec", ["--spec", "--no-spec"])
def test_prompt_at_the_edge_of_the_context(spec, cli):
    """One token short of the context: generation stops when it is full (finish 'context'),
    speculative or not, with the same tokens."""
    edge = ("the cat sat on the mat. " * 30)[: TOY_CONTEXT - 1]
    code, out, err = cli("generate", "--model", "toy", "-p", edge, "-n", 20, spec, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["finish_reason"] == "context" and 1 <= len(result["tokens"]) < 20
    target = ToyTarget(seed=0)
    assert result["tokens"] == plain_tokens(target, target.tokenizer.encode(edge), 20)


NOT_UTF8 = b"hello \xff\xfe world"


@pytest.mark.parametrize("via", ["stdin", "file", "file '-'"])
def test_non_utf8_prompt(via, cli, tmp_path):
    argv = ["generate", "--model", "toy", "-n", N]
    stdin = None
    if via == "stdin":
        stdin = NOT_UTF8
    elif via == "file":
        (tmp_path / "latin1.txt").write_bytes(NOT_UTF8)
        argv += ["--prompt-file", tmp_path / "latin1.txt"]
    else:
        stdin = NOT_UTF8
        argv += ["--prompt-file", "-"]
    assert_usage_error(*cli(*argv, stdin=stdin), "not valid UTF-8 (byte 6)")


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_unreadable_prompt_file(what, cli, tmp_path):
    path = tmp_path / "absent.txt" if what == "missing" else tmp_path
    assert_usage_error(*cli("generate", "--model", "toy", "--prompt-file", path), "cannot read the prompt file", str(path))


def test_prompt_from_stdin_and_file_work(cli, tmp_path):
    expected = _plain_text() + "\n"
    code, out, err = cli("generate", "--model", "toy", "-n", N, stdin=PROMPT.encode())
    assert (code, out) == (0, expected), err
    (tmp_path / "p.txt").write_text(PROMPT)
    code, out, err = cli("generate", "--model", "toy", "-n", N, "--prompt-file", tmp_path / "p.txt")
    assert (code, out) == (0, expected), err


# -- config files ------------------------------------------------------------------------------

BAD_CONFIGS = {
    "unknown key": ("[spec]\ntypo = 1\n", "unknown key spec.typo"),
    "unknown section": ("[bogus]\nx = 1\n", "unknown section [bogus]"),
    "string for an int": ('[spec]\ndraft = "8"\n', "spec.draft must be int"),
    "bool for a number": ("[sampling]\ntemperature = true\n", "sampling.temperature must be"),
    "string for a list": ('[plugins]\nenabled = "ngram"\n', "plugins.enabled must be list"),
    "list of non-strings": ("[plugins]\ndisabled = [1, 2]\n", "plugins.disabled must be a list of strings"),
    "not a table": ("spec = 3\n", "[spec] must be a table"),
    "not TOML": ("[spec\ndraft = 8\n", "is not valid TOML"),
    "out of range": ("[spec]\ndraft = 100\n", "--spec-draft must be between 1 and 64"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
@pytest.mark.parametrize("how", ["--config", "TSSPEC_CONFIG", "./tsspec.toml"])
def test_bad_config_files(case, how, cli, tmp_path, monkeypatch):
    text, phrase = BAD_CONFIGS[case]
    path = tmp_path / "tsspec.toml"
    path.write_text(text)
    argv = ["generate", "--model", "toy", "-p", PROMPT, "-n", N]
    if how == "--config":
        argv = ["--config", path, *argv]
    elif how == "TSSPEC_CONFIG":
        monkeypatch.setenv("TSSPEC_CONFIG", str(path))
    line = assert_usage_error(*cli(*argv), phrase)
    if case != "out of range":
        assert str(path.name) in line  # the error says which file


def test_config_not_utf8_or_missing(cli, tmp_path):
    path = tmp_path / "binary.toml"
    path.write_bytes(b"[spec]\ndraft = \xff\n")
    assert_usage_error(*cli("--config", path, "generate", "--model", "toy", "-p", PROMPT), "cannot read config file")
    missing = tmp_path / "nope.toml"
    assert_usage_error(*cli("--config", missing, "generate", "--model", "toy", "-p", PROMPT), "does not exist")


def test_a_good_config_is_applied(cli, tmp_path):
    """The control: a valid config runs, and its --no-spec-equivalent takes effect."""
    path = tmp_path / "good.toml"
    path.write_text("[spec]\nenabled = false\n")
    code, out, err = cli("--config", path, "generate", "--model", "toy", "-p", PROMPT, "-n", N, "--stats")
    assert code == 0 and out == _plain_text() + "\n" and "[stats] plain" in err


# -- tuning flags with --no-spec ---------------------------------------------------------------


def test_tuning_flags_with_no_spec_warn_once_each(cli):
    code, out, err = cli("generate", "--model", "toy", "-p", PROMPT, "-n", N, "--no-spec",
                         "--spec-draft", 4, "--spec-pmin", 0.5, "--spec-type", "ngram")
    assert code == 0 and out == _plain_text() + "\n"
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert sorted(warnings) == sorted(
        f"warning: {flag} has no effect with speculation off (--no-spec)"
        for flag in ("--spec-draft", "--spec-pmin", "--spec-type"))


def test_speculative_cli_output_equals_plain(cli):
    expected = _plain_text() + "\n"
    for spec in (["--spec"], ["--no-spec"], ["--spec", "--spec-draft", "1"], ["--spec", "--spec-draft", "64"]):
        code, out, err = cli("generate", "--model", "toy", "-p", PROMPT, "-n", N, *spec)
        assert (code, out) == (0, expected), (spec, err)


def test_subprocess_bad_flag_has_no_traceback():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TSSPEC_", "TS_SPEC_", "TS_MTP_"))}
    env["TSSPEC_PLUGINS"] = ""
    proc = subprocess.run(
        [sys.executable, "-c", "from tsspec.cli.app import main; main()",
         "generate", "--model", "toy", "-p", PROMPT, "--spec-pmin", "2"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["tsspec: error: --spec-pmin must be between 0 and 1, got 2.0"]


# -- --stop: streamed text must equal the final text -------------------------------------------


@pytest.mark.parametrize("stop", ["ze", "zq", "z", "p?zp", "eee", "nothing like it"])
def test_stop_strings_spanning_tokens_stream_exactly_the_final_text(stop, cli):
    """A stop string that starts in one token and ends in a later one: the first half must not
    have been streamed already (the output would show it, then repeat the text)."""
    argv = ["generate", "--model", "toy", "-p", "hello world", "-n", 30, "--stop", stop]
    code, streamed, err = cli(*argv)
    assert code == 0, err
    code, out, err = cli(*argv, "--json")
    final = json.loads(out)["text"]
    assert streamed == final + "\n"
    assert stop not in final


def test_stop_strings_api_pieces_add_up(cli):
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions

    target = ToyTarget(seed=0)
    full = target.tokenizer.decode(plain_tokens(target, target.tokenizer.encode(PROMPT), 40))
    for cut in range(1, len(full) - 2, 3):  # stop strings taken from the output itself
        for width in (1, 2, 3):
            stop = full[cut: cut + width]
            for options in (SpeculationOptions(enabled=False), SpeculationOptions(spec_type="ngram")):
                pieces: list[str] = []
                result = generate(ToyTarget(seed=0), PROMPT, options, max_tokens=40, stop=[stop],
                                  on_token=lambda tok, piece: pieces.append(piece) and None)
                assert "".join(pieces) == result.text == full[: full.find(stop)], (stop, pieces)
