"""The product docs stay what a newcomer reads: short, and free of run logs."""

from __future__ import annotations

from pathlib import Path

import pytest

import tsspec

REPO = Path(tsspec.__file__).resolve().parent.parent
LIMITS = {"README.md": 150, "docs/architecture.md": 250}


@pytest.mark.parametrize("name,limit", sorted(LIMITS.items()))
def test_the_docs_stay_short(name, limit):
    path = REPO / name
    if not path.is_file():
        pytest.skip("an installed (non-checkout) tsspec")
    assert len(path.read_text().splitlines()) <= limit


def test_every_relative_link_of_the_readme_resolves():
    import re

    path = REPO / "README.md"
    if not path.is_file():
        pytest.skip("an installed (non-checkout) tsspec")
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text())
    assert links and [link for link in links if not (REPO / link).exists()] == []
