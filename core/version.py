"""The version of tsspec and of its plugin contract, one number. A plugin needing a newer contract
(``TSSPEC_CONTRACT = "X.Y"``: same major, minor no newer) is recorded ``failed``, not loaded."""

from __future__ import annotations

CONTRACT_VERSION = "1.0.0"


def parse(version: str) -> tuple[int, ...]:
    """``"1.2"`` / ``"1.2.3"`` -> (1, 2) / (1, 2, 3); ValueError naming the text otherwise."""
    parts = str(version).strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a contract version: {version!r} (use MAJOR.MINOR)")
    return tuple(int(p) for p in parts)


def incompatibility(required: object) -> str | None:
    """Why a plugin requiring contract ``required`` cannot load here, or None when it can."""
    try:
        want = parse(str(required))
    except ValueError as exc:
        return str(exc)
    have = parse(CONTRACT_VERSION)
    if want[0] != have[0] or want[:2] > have[:2]:
        return f"needs plugin contract {required}; this tsspec provides {CONTRACT_VERSION}"
    return None
