"""Imports inside tsspec only point down the layers docs/architecture.md draws, and the core
names no plugin."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tsspec

ROOT = Path(tsspec.__file__).resolve().parent
# docs/architecture.md, "Packages and the direction of imports"
LAYER = {"errors": 0, "protocols": 0, "hookspecs": 0, "switches": 0, "config": 0, "cost_shape": 0, "version": 0,
         "capabilities": 0,
         "plugins": 1, "runtime": 2, "testing": 3, "cli": 5, "testing_fixtures": 5}
REPO = ROOT.parent  # the checkout: core/ is the package, plugins/ and kernels_cuda/ beside it
INTERNAL = ("tsspec.runtime", "tsspec.cli")
# the first-party tooling plugins, released with the core, build on its runtime internals
TOOLING = ("tsspec_bench", "tsspec_training", "tsspec_ray")
# runtime functions that are public dispatch (docs/plugins.md): one plugin reaching another's
PUBLIC_DISPATCH = ("tsspec.runtime.converting.convert_as",)
# the one documented exception (docs/architecture.md): the serve command builds on the CLI
SERVE_ALLOWED = ("tsspec.cli.flags", "tsspec.cli.state", "tsspec.cli.generate_cmd", "tsspec.runtime.loading",
                 "tsspec.runtime.batching", "tsspec.runtime.batched_trunk", "tsspec.runtime.stats",
                 "tsspec.runtime.defaults")


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
    """No core module imports a plugin package or names one (every plugin package is
    ``tsspec_<name>``; the hook names ``tsspec_register_*`` are the core's own)."""
    named = [f"{p.relative_to(ROOT)} -> {m}" for p in ROOT.rglob("*.py") for m in _imports(p)
             if m.split(".")[0].startswith("tsspec_")]
    assert named == []
    plugin_name = re.compile(r"\btsspec_(?!register_)[a-z]\w*")
    mentioned = [f"{p.relative_to(ROOT)}:{n}: {m.group()}" for p in sorted(ROOT.rglob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1) for m in plugin_name.finditer(line)]
    assert mentioned == []


def test_builtin_plugins_import_only_the_public_api():
    """Plugins import ``tsspec``, its layer-0 modules and ``tsspec_gguf``; never the runtime,
    bench or CLI internals (the serve command's documented exception aside)."""
    sources = [*REPO.glob("plugins/*/src/**/*.py"), *REPO.glob("kernels_cuda/src/**/*.py"),
               *REPO.glob("examples/*/src/**/*.py")]
    if not sources:  # an installed (non-checkout) tsspec: nothing to read
        return
    internal = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [])
            for name in names:
                command = path.name == "inspect_cmd.py" and name.startswith(SERVE_ALLOWED)  # a CLI command
                allowed = ("tsspec_serve" in path.parts and name.startswith(SERVE_ALLOWED)) or command or any(
                    tool in path.parts for tool in TOOLING) or name in PUBLIC_DISPATCH
                if name.startswith(INTERNAL) and not allowed:
                    internal.append(f"{path.relative_to(REPO)} -> {name}")
    assert internal == []
