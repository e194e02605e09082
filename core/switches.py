"""Environment switches that turn one optimisation off so a benchmark can attribute its effect.

One parser and one list: every switch is on unless set to ``0``, ``false``, ``no`` or ``off``
(any case, surrounding blanks ignored). ``tsspec --help`` and docs/architecture.md print
``SWITCHES``. A switch never changes output, only how it is computed.
"""

from __future__ import annotations

import os
from typing import Mapping

OFF_WORDS = frozenset({"0", "false", "no", "off"})

# name -> what setting it to 0 does (read when the target / speculator / drafter is created)
SWITCHES = {
    "TS_Q35_VERIFY_SNAPSHOTS": "hybrid (DeltaNet) targets roll back by restore + re-forward "
    "instead of committing per-row state slots",
    "TS_MTP_FOLD_CATCHUP": "per-token draft heads catch up on committed rows with a call of "
    "their own instead of folding it into the next proposal's first call",
    "TS_DFLASH_CONV": "DFlash2 block drafters run without their grouped convolution",
    "TS_DFLASH_SELECTOR": "DFlash2 block drafters take the plain argmax instead of the "
    "candidate selector",
    "TS_MTP_NATIVE": "NextN drafter files draft on the torch module instead of the compiled "
    "CPU kernels",
    "TS_MTP_ONE_CALL": "a NextN head call on the compiled kernels runs as seven kernel calls "
    "(norms, gemms, layer, head) instead of one",
    "TS_MTP_THREAD_CHOICE": "a NextN head call on the compiled kernels takes torch's thread "
    "count instead of the count measured fastest while drafting",
    "TS_DFLASH_NATIVE": "DFlash block drafters run their matrices in torch (float32) instead of "
    "as int8 blocks on the compiled CPU kernels",
}


def switch_on(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether switch ``name`` is on: unset, empty or anything but an off word.

    >>> switch_on("TS_DFLASH_CONV", {"TS_DFLASH_CONV": " Off "})
    False
    >>> switch_on("TS_DFLASH_CONV", {})
    True
    """
    env = os.environ if environ is None else environ
    return env.get(name, "").strip().lower() not in OFF_WORDS


def describe() -> str:
    """One line per switch, for ``--help`` and the docs."""
    return "\n".join(f"{name}=0: {what}" for name, what in SWITCHES.items())
