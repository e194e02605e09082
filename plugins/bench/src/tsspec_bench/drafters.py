"""The drafter each benchmarked configuration runs with.

A target holds one draft head at a time, but a bench compares algorithms that want different
drafters (draft-head with an MTP file, block with a DFlash file, ``auto`` with whatever the
loader would attach). For a model file, every drafter a plugin ships for exactly that file
(``tsspec.runtime.bundled``) is attached once, and the runner installs the right head before
each run: ``{config name: head}``; a configuration missing from the map runs with the head the
target was loaded with (an operator's ``--draft-model``, or none).
"""

from __future__ import annotations

from typing import Any

from tsspec.runtime import bundled
from tsspec.runtime.loading import LoadOptions, attach_drafter
from tsspec.runtime.registry import AUTO

def _state(target) -> tuple[Any, Any]:
    """(draft head, feature taps): what a drafter's attach function sets on the target."""
    return getattr(target, "draft_head", None), getattr(target, "feature_taps", None)


def _set_state(target, state: tuple[Any, Any]) -> None:
    head, taps = state
    if getattr(target, "feature_taps", None) != taps and hasattr(target, "spec_set_feature_taps"):
        target.spec_set_feature_taps(None if taps is None else list(taps))
    target.draft_head = head


def bundled_heads(catalog, target, model_path: str | None, load_options: LoadOptions, *,
                  operator_drafter: bool = False) -> dict[str, tuple[Any, Any]]:
    """{algorithm or ``auto``: (head, feature taps) of the bundled drafter it would run with}
    for ``model_path``; empty for file-less models, without bundled drafters, or when the
    operator attached a drafter (``operator_drafter``: that one then serves every
    configuration). The target is left as it was."""
    records = getattr(catalog, "bundled_drafters", None) or []
    if model_path is None or operator_drafter or not records or not bundled.enabled():
        return {}
    loaded = _state(target)
    heads: dict[str, tuple[Any, Any]] = {}
    by_path: dict[str, tuple[Any, Any]] = {}
    wanted = list(dict.fromkeys([*(r.algorithm for r in records if r.algorithm), AUTO]))
    try:
        for name in wanted:
            record = bundled.pick(records, model_path, name)
            if record is None:
                continue
            if record.path not in by_path:
                _set_state(target, (None, None))
                attach_drafter(target, record.path, load_options, catalog)
                by_path[record.path] = _state(target)
            heads[name] = by_path[record.path]
    finally:
        _set_state(target, loaded)
    return heads


class HeadSwitch:
    """Installs a configuration's drafter state on the target (``use``); ``restore`` puts the
    loaded one back. Configurations without an entry run with the loaded state."""

    def __init__(self, target, heads: dict[str, tuple[Any, Any]]):
        self.target = target
        self.heads = dict(heads)
        self.loaded = _state(target)

    def use(self, config_name: str) -> None:
        if self.heads:
            _set_state(self.target, self.heads.get(config_name, self.loaded))

    def restore(self) -> None:
        if self.heads:
            _set_state(self.target, self.loaded)
