"""Environment switches that turn one optimisation off so a benchmark can attribute its effect.

One parser: every switch is on unless set to ``0``, ``false``, ``no`` or ``off`` (any case,
surrounding blanks ignored). Each plugin declares its own switches through
``tsspec_register_switches``; ``tsspec --help`` prints what the catalog collected. A switch never changes output, only how it is computed.
"""

from __future__ import annotations

import os
from typing import Mapping

OFF_WORDS = frozenset({"0", "false", "no", "off"})


def switch_on(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether switch ``name`` is on: unset, empty or anything but an off word.

    >>> switch_on("TS_DFLASH_CONV", {"TS_DFLASH_CONV": " Off "})
    False
    >>> switch_on("TS_DFLASH_CONV", {})
    True
    """
    env = os.environ if environ is None else environ
    return env.get(name, "").strip().lower() not in OFF_WORDS


def describe(switches: Mapping[str, str]) -> str:
    """One line per switch (name -> what setting it to 0 does), for ``--help`` and the docs."""
    return "\n".join(f"{name}=0: {what}" for name, what in sorted(switches.items()))
