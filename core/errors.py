"""Operator-facing errors, each one line naming the problem (the CLI: exit code 2)."""

from __future__ import annotations

EXIT_USAGE = 2


class TsspecError(Exception):
    """Base of every error the CLI reports as one line with exit code 2."""


class OptionsError(TsspecError):
    """A flag, environment variable or config value is out of range or conflicts."""


class ConfigError(TsspecError):
    """The config file cannot be read, or has an unknown key or a value of the wrong type."""


class ModelLoadError(TsspecError):
    """A model or drafter file cannot be loaded; the message names the file and the problem."""

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class GenerationError(TsspecError):
    """A generation request cannot be served as asked (empty prompt, prompt over the context)."""
