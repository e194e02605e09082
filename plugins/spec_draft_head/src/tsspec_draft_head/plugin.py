"""The ``draft-head`` registration: factory and hook implementation.

The factory only decides whether this algorithm can serve a target (it needs a PER_TOKEN draft
head attached to it), takes a per-sequence view of the head when it offers one
(``for_sequence``) and reads ``--spec-pmin``; the loop decides the draft window and hands it
over in ``DraftContext``. Everything else is in ``speculator.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tsspec.hookspecs import hookimpl
from tsspec.protocols import DraftHeadKind, SpeculatorDeclined
from tsspec import MAX_DRAFT_WINDOW, SpeculationOptions

if TYPE_CHECKING:  # the speculator needs torch: imported when a speculator is made, not at start-up
    from .speculator import DraftHeadSpeculator

ALGORITHM = "draft-head"

DESCRIPTION = (
    "per-token learned drafter (NextN / MTP, EAGLE-shaped): chains the checkpoint's draft head "
    "one token at a time, gated on its top-1 probability"
)


def make_draft_head(target, options: SpeculationOptions | None = None) -> "DraftHeadSpeculator":
    """A DraftHeadSpeculator over ``target.draft_head``, or SpeculatorDeclined saying why not."""
    from .speculator import DEFAULT_MIN_DRAFT_PROB, DraftHeadSpeculator

    options = options if options is not None else SpeculationOptions()
    head = getattr(target, "draft_head", None)
    if head is None:
        raise SpeculatorDeclined(
            "the model carries no per-token draft head (NextN / MTP); attach one "
            "(--spec-draft-model) or use the weight-free --spec-type ngram"
        )
    kind = getattr(head, "kind", DraftHeadKind.NONE)
    if kind is not DraftHeadKind.PER_TOKEN:
        hint = " (--spec-type block serves it)" if kind is DraftHeadKind.BLOCK else ""
        raise SpeculatorDeclined(
            f"its draft head is of kind {getattr(kind, 'value', kind)!s}, not per_token{hint}"
        )
    # a drafter file may recommend its own gate and chain length (read from its metadata, for
    # any head that offers them); the operator's --spec-pmin / --spec-draft win
    pmin = _recommended(head, "recommended_pmin", float, DEFAULT_MIN_DRAFT_PROB)
    chain = None if options.draft is not None else _recommended(head, "recommended_draft_max", int, None)
    # a head that offers per-sequence views gets one per speculator: sequences served at once
    # each keep their own context (its KV cache) over the shared weights
    make_view = getattr(head, "for_sequence", None)
    view = make_view() if callable(make_view) else head
    # the head's recommended gate is this speculator's DefaultMinDraftProb; the registry sets
    # min_draft_prob to --spec-pmin when given, else to that default
    speculator = DraftHeadSpeculator(
        view,
        max_draft_tokens=MAX_DRAFT_WINDOW,  # a chain has no limit of its own: the loop's window is it
        feature_size=target.spec_feature_size,
        min_draft_prob=pmin if options.pmin is None else options.pmin,
        owns_head=view is not head,
        chain_limit=chain,
    )
    speculator.default_min_draft_prob = pmin
    return speculator


def _recommended(head, name: str, kind, default):
    """A head's recommended setting ``name``, or ``default`` when it offers none."""
    value = getattr(head, name, None)
    if value is None:
        return default
    try:
        return kind(value)
    except (TypeError, ValueError):
        return default


@hookimpl
def tsspec_register_speculators(register):
    register(ALGORITHM, make_draft_head, requires_draft_head=True, serves_kind=DraftHeadKind.PER_TOKEN,
             weight_free=False, description=DESCRIPTION)


@hookimpl
def tsspec_register_drafters(register):
    """Separate NextN drafter files (``tsspec train-drafter --kind mtp`` writes them)."""

    def attach(target, gguf_path, options=None):
        from .nextn_file import attach_nextn

        return attach_nextn(target, gguf_path, options)

    register(["nextn"], attach)


@hookimpl
def tsspec_register_trainers(register):
    def train(request, target, log=print, progress=None):
        from .trainer import train_mtp

        return train_mtp(request, target, log, progress)

    register("mtp", train, description="NextN / MTP per-token head (file architecture 'nextn')")

    def train_eagle(request, target, log=print, progress=None):
        from .eagle import train_eagle3

        return train_eagle3(request, target, log, progress)

    register("eagle3", train_eagle, description="EAGLE-3-style per-token head: three fused target layers, "
             "trained on the target's own answers (file architecture 'nextn')")


# environment switch -> what setting it to 0 does (each read through tsspec.switches.switch_on)
SWITCHES = {
    "TS_MTP_FOLD_CATCHUP": "per-token draft heads catch up on committed rows with a call of "
    "their own instead of folding it into the next proposal's first call",
    "TS_MTP_NATIVE": "NextN drafter files draft on the torch module instead of the compiled CPU kernels",
    "TS_MTP_ONE_CALL": "a NextN head call on the compiled kernels runs as seven kernel calls "
    "(norms, gemms, layer, head) instead of one",
    "TS_MTP_THREAD_CHOICE": "a NextN head call on the compiled kernels takes torch's thread "
    "count instead of the count measured fastest while drafting",
}


@hookimpl
def tsspec_register_switches(register):
    for name, what in SWITCHES.items():
        register(name, what)
