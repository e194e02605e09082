"""Imports inside tsspec only point down the layers docs/architecture.md draws, and the core
names no plugin."""

from __future__ import annotations

import ast
from pathlib import Path

import tsspec

ROOT = Path(tsspec.__file__).resolve().parent
# docs/architecture.md, "Packages and the direction of imports"
LAYER = {"errors": 0, "protocols": 0, "hookspecs": 0, "switches": 0, "config": 0, "data": 0,
         "plugins": 1, "modeling": 1, "runtime": 2, "testing": 3, "toy_heads": 3, "bench": 4, "cli": 5}
PLUGIN_PACKAGES = ("tsspec_ngram", "tsspec_block", "tsspec_draft_head", "tsspec_model_llama",
                   "tsspec_model_qwen35", "tsspec_model_toy", "tsspec_medusa")


def _imports(path: Path) -> list[str]:
    """Absolute module names (``tsspec.x.y`` or others) imported by ``path``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(["tsspec", *base, *([node.module] if node.module else [])])
                found += [module] if node.module else [f"{module}.{a.name}" for a in node.names]
            elif node.module:
                found.append(node.module)
    return found


def test_no_upward_import_edges():
    upward = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if parts == ("__init__.py",):
            continue  # the package's lazy public surface sits outside the layering
        mine = LAYER[parts[0].removesuffix(".py")]
        for module in _imports(path):
            bits = module.split(".")
            if bits[0] == "tsspec" and len(bits) > 1 and LAYER.get(bits[1], 0) > mine:
                upward.append(f"{path.relative_to(ROOT)} -> {module}")
    assert upward == []


def test_the_core_imports_no_plugin():
    named = [f"{p.relative_to(ROOT)} -> {m}" for p in ROOT.rglob("*.py") for m in _imports(p)
             if m.split(".")[0] in PLUGIN_PACKAGES]
    assert named == []
