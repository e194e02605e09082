"""Environment switches that turn one optimisation off (output never changes), declared by plugins
through ``tsspec_register_switches`` and read through ``switch_on``."""

from __future__ import annotations

import os
from typing import Mapping

OFF_WORDS = frozenset({"0", "false", "no", "off"})


def switch_on(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """On unless set to ``0``, ``false``, ``no`` or ``off`` (any case, blanks ignored).

    >>> switch_on("TS_X", {"TS_X": " Off "}), switch_on("TS_X", {})
    (False, True)"""
    env = os.environ if environ is None else environ
    return env.get(name, "").strip().lower() not in OFF_WORDS


def describe(switches: Mapping[str, str]) -> str:
    """One line per switch (name -> what setting it to 0 does), for ``--help`` and the docs."""
    return "\n".join(f"{name}=0: {what}" for name, what in sorted(switches.items()))
