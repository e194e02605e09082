"""What the loader was asked for, read while the model loads: does anyone want the NextN head?

The speculation environment is read here, at load time (``TS_SPEC_*``, else ``TS_MTP_*``:
``TS_MTP_SPEC``, ``TS_MTP_TYPE``, ``TS_MTP_DRAFT``; the CLI publishes its flags under both
prefixes before loading), over the options handed to the loader (the Python API's). Draft-head
speculation is requested when speculation is on and the type is ``auto`` or ``draft-head``;
otherwise the NextN layer's weights are neither read nor allocated. ``TS_MTP_DRAFT`` (the draft
window) is read and validated here (a bad value fails the load with one line); the head's cache
grows by position, so the window does not change what is allocated.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import attrs

from tsspec import SpeculationOptions

DRAFT_HEAD_TYPES = ("auto", "draft-head")


@attrs.frozen
class NextNRequest:
    wanted: bool
    reason: str  # why not, in words the operator set (empty when wanted)
    window: int | None = None  # the draft window asked for, if any


def read_request(options: Any = None, environ: Mapping[str, str] | None = None) -> NextNRequest:
    """The request from the environment over ``options`` (a LoadOptions, SpeculationOptions or None).
    An invalid value in the environment raises the options' one-line OptionsError."""
    env = os.environ if environ is None else environ
    base = getattr(options, "speculation", options)
    from_env = SpeculationOptions.resolve(env=env)
    fields = {}
    for name in ("enabled", "spec_type", "draft"):
        if name in from_env.explicit or base is None:
            fields[name] = getattr(from_env, name)
        else:
            fields[name] = getattr(base, name, getattr(from_env, name))
    if not fields["enabled"]:
        return NextNRequest(False, "speculation is off (TS_MTP_SPEC / TS_SPEC_SPEC / --no-spec)", fields["draft"])
    if fields["spec_type"] not in DRAFT_HEAD_TYPES:
        return NextNRequest(False, f"the speculation type is {fields['spec_type']!r} (TS_MTP_TYPE / TS_SPEC_TYPE / "
                                   "--spec-type), not draft-head", fields["draft"])
    return NextNRequest(True, "", fields["draft"])
