"""Suite-wide checks: with ``TSSPEC_REQUIRE_NATIVE=1`` (set by .ci/run) a build whose compiled CPU
kernels, or an installed plugin's own extension on them, are missing fails the run instead of
skipping to a slower path."""

from __future__ import annotations

import os

import pytest
from tsspec.testing_fixtures import _isolated_environ  # noqa: F401  (every suite: os.environ restored after each test)

ON_WORDS = {"1", "true", "yes", "on"}
# the plugins' compiled extensions on the kernels' C-API: (plugin package, extension module)
PLUGIN_EXTENSIONS = (
    ("tsspec_model_llama", "tsspec_model_llama._step_kernels"),
    ("tsspec_draft_head", "tsspec_draft_head._head_kernels"),
)


# read once at start-up: tests clear TSSPEC_* from their own environment
REQUIRED = os.environ.get("TSSPEC_REQUIRE_NATIVE", "").strip().lower() in ON_WORDS


def pytest_sessionstart(session):
    if not REQUIRED:
        return
    from tsspec_gguf import native

    if native.forced_off():
        raise pytest.UsageError("TSSPEC_REQUIRE_NATIVE=1 and TSSPEC_NATIVE=0 contradict each other")
    if not native.available():
        raise pytest.UsageError(
            "TSSPEC_REQUIRE_NATIVE=1 but the compiled CPU kernels (tsspec_gguf._cpu_kernels) "
            "did not build or do not import: rebuild with `pip install -e .` and read its compiler output")
    import importlib
    import importlib.util

    for package, name in PLUGIN_EXTENSIONS:
        if importlib.util.find_spec(package) is None:
            continue  # the plugin is not installed
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise pytest.UsageError(
                f"TSSPEC_REQUIRE_NATIVE=1 but {name} did not build or does not import ({exc}): "
                f"rebuild its plugin with `pip install -e` and read its compiler output") from exc


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under the requirement, a skip that blames missing kernels is a failure."""
    outcome = yield
    report = outcome.get_result()
    if not (REQUIRED and report.skipped and isinstance(report.longrepr, tuple)):
        return
    reason = str(report.longrepr[2]).lower()
    if "kernel" in reason and ("built" in reason or "compiled" in reason):
        report.outcome = "failed"
        report.longrepr = f"TSSPEC_REQUIRE_NATIVE=1 turns this skip into a failure: {report.longrepr[2]}"
