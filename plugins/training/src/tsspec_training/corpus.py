"""The training corpus: text found on this machine plus the target's own chat answers.

Every source is a ``Document`` list with a manifest entry (name, origin, license, token count
once tokenised). Sources:

* ``stdlib-docstrings`` module, class and function docstrings of the Python standard library
  (PSF-2.0), read with ``ast`` from the interpreter's own ``.py`` files;
* ``stdlib-source``     the source text of a seeded sample of those modules (PSF-2.0);
* ``package-docs``      the long descriptions (README text) in installed distributions'
  metadata, each with the license its metadata declares;
* ``chat-answers``      the target's greedy answers to generated instruction prompts (see
  ``prompts``), written once and cached: the distribution the drafter will serve.

Sampling is seeded and sources are read in sorted order, so a corpus is reproducible on the
same interpreter and packages.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as metadata
import random
import sysconfig
from pathlib import Path

import attrs

SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "ensurepip", "site-packages", "dist-packages",
             "turtledemo", "__pycache__", "pydoc_data", "venv", "tkinter"}


@attrs.frozen
class Document:
    source: str  # the manifest name of the source it came from
    text: str


@attrs.define
class SourceInfo:
    name: str
    origin: str
    license: str
    documents: int = 0
    characters: int = 0
    tokens: int = 0

    def to_json(self) -> dict:
        return attrs.asdict(self)


def _stdlib_files() -> list[Path]:
    """The standard library's modules (sorted; a fresh list each call, callers shuffle it)."""
    return list(_stdlib_paths())


@functools.lru_cache(maxsize=1)
def _stdlib_paths() -> tuple[Path, ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts[:-1])
        if parts & SKIP_DIRS or path.name.startswith("test_"):
            continue
        files.append(path)
    return tuple(files)


def _docstrings(text: str) -> list[str]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 80:
                out.append(doc)
    return out


def stdlib_sources(max_chars: int, seed: int) -> tuple[list[Document], list[Document], list[SourceInfo]]:
    """(docstring documents, source documents, their manifest entries), each up to ``max_chars``."""
    rng = random.Random(seed)
    files = _stdlib_files()
    rng.shuffle(files)
    docs: list[Document] = []
    code: list[Document] = []
    doc_chars = code_chars = 0
    root = sysconfig.get_paths()["stdlib"]
    for path in files:
        if doc_chars >= max_chars and code_chars >= max_chars:
            break
        try:
            text = path.read_text("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if doc_chars < max_chars:
            for doc in _docstrings(text):
                docs.append(Document("stdlib-docstrings", doc))
                doc_chars += len(doc)
        if code_chars < max_chars and 2_000 <= len(text):
            piece = text[: min(len(text), 12_000)]
            code.append(Document("stdlib-source", piece))
            code_chars += len(piece)
    info = [
        SourceInfo("stdlib-docstrings", f"docstrings of the Python standard library at {root}", "PSF-2.0",
                   len(docs), doc_chars),
        SourceInfo("stdlib-source", f"source of a seeded sample of standard-library modules at {root}",
                   "PSF-2.0", len(code), code_chars),
    ]
    return docs, code, info


def _license(meta) -> str:
    value = (meta.get("License-Expression") or "").strip()
    if not value:
        value = (meta.get("License") or "").strip().splitlines()[0:1]
        value = value[0] if value else ""
    if not value or len(value) > 60:
        classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or () if c.startswith("License")]
        value = classifiers[0] if classifiers else "unknown"
    return value


def package_docs(max_chars: int, seed: int) -> tuple[list[Document], SourceInfo]:
    """README text from installed distributions' metadata (one manifest entry, licenses listed)."""
    dists = {}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").strip()
        body = dist.metadata.get_payload() if hasattr(dist.metadata, "get_payload") else None
        body = body or dist.metadata.get("Description") or ""
        if name and len(body) >= 500 and name.lower() not in dists:
            dists[name.lower()] = (name, body, _license(dist.metadata))
    rng = random.Random(seed)
    names = sorted(dists)
    rng.shuffle(names)
    docs: list[Document] = []
    used: list[str] = []
    chars = 0
    for key in names:
        if chars >= max_chars:
            break
        name, body, lic = dists[key]
        piece = body[:8_000]
        docs.append(Document("package-docs", piece))
        used.append(f"{name} ({lic})")
        chars += len(piece)
    info = SourceInfo("package-docs", "README text in installed distributions' metadata: " + ", ".join(sorted(used)),
                      "per package: " + "; ".join(sorted(used)), len(docs), chars)
    return docs, info
