"""docs/plugins.md's tutorial runs as written: its plugin module registers through the plugin
host, and its test passes; the tutorial stays one page and the reference has no changelog."""

import re
import sys
import types
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def _tutorial() -> str:
    text = DOC.read_text()
    return text[text.index("## Tutorial"):text.index("## Reference")]


def test_the_tutorial_plugin_and_its_test_run(monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", _tutorial(), re.S)
    module_src, test_src = blocks[0], blocks[1]
    module = types.ModuleType("tsspec_bigram")
    exec(compile(module_src, "tsspec_bigram", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "tsspec_bigram", module)
    namespace: dict = {}
    exec(compile(test_src, "test_bigram", "exec"), namespace)
    namespace["test_lossless_greedy_and_sampled"]()
    from tsspec.testing import plugin_catalog

    assert plugin_catalog({"bigram": module}).host.records["bigram"].status == "loaded"


def test_one_page_tutorial_and_a_reference_without_changelog():
    assert len(_tutorial().splitlines()) <= 100
    text = DOC.read_text()
    assert "changelog" not in text.lower()
    import tsspec

    reference = text[text.index("### `tsspec.__all__`"):text.index("### Capability records")]
    for name in tsspec.__all__:
        assert f"`{name}" in reference, name
