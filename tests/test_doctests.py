"""The examples in docstrings run: every first-party module (the core and each plugin's package)
whose source holds a ``>>>`` example is imported by its package name and its doctests run."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _packages() -> dict[str, Path]:
    """Package name -> source folder: ``tsspec`` is ``core/``; plugins live under ``*/src/``."""
    roots = {"tsspec": REPO / "core"}
    for folder in sorted(REPO.glob("plugins/*/src/*")) + sorted(REPO.glob("kernels_cuda/src/*")):
        if (folder / "__init__.py").is_file():
            roots[folder.name] = folder
    return roots


def _modules_with_examples() -> list[str]:
    names = []
    for package, root in _packages().items():
        for path in sorted(root.rglob("*.py")):
            if "tests" in path.relative_to(root).parts or ">>> " not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(root).with_suffix("").parts
            names.append(".".join((package, *parts)).removesuffix(".__init__"))
    return names


MODULES = _modules_with_examples()


def test_examples_were_found():
    assert {"tsspec.protocols", "tsspec_bench.governor_check", "tsspec_block.speculator"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_doctests_pass(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(module, name):
        runner.run(test, out=lambda text: pytest.fail(f"{name}: doctest failed\n{text}", pytrace=False))
    assert runner.tries > 0 or ">>> " not in (module.__doc__ or "")
