"""Long-run soak: thousands of generate calls in one process, random algorithms, prompts, seeds,
samplers, windows and trunk regimes; every call must equal plain decoding token for token, and
the process must not grow.

Off by default (pytest's addopts deselect ``soak``). Run it with::

    python -m pytest -m soak tests/test_soak.py -q -s        # or: make soak

Knobs (environment): ``TSSPEC_SOAK_CALLS`` (default 5000), ``TSSPEC_SOAK_SECONDS`` (stop early
after this long; default: no limit), ``TSSPEC_SOAK_SEED`` (the run's seed; a failure message
names the call index and its configuration so it can be replayed).

Algorithms: every one the installed plugins register that can serve the toy target (``ngram``;
``draft-head`` with a toy per-token head attached, good or confidently wrong; ``block`` with a
random DFlash drafter attached through the drafter registry), plus the testing kit's
``OracleSpeculator`` (corrupting), ``RandomSpeculator`` and ``AdversarialSpeculator`` (every
misbehaviour). A share of the calls are two-turn conversations on one ``SpeculativeExecution``
over a rewindable trunk, so the cached-prefix path runs too.

Memory: resident set size after a warm-up (the first ``WARMUP_SHARE`` of the calls, at least
``MIN_WARMUP`` calls) against the end of the run, both after ``gc.collect()``. Allowed growth:
``RSS_TOLERANCE_BYTES`` (allocator high-water marks and interned objects settle within a few MiB;
a per-call leak of even one kilobyte over thousands of calls exceeds it).
"""

from __future__ import annotations

import gc
import logging
import os
import random
import time
from pathlib import Path

import attrs
import pytest

from tsspec.runtime.execution import SpeculativeExecution
from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import Sampler, SamplingParams
from tsspec.testing import (
    ADVERSARIAL_MODES,
    AdversarialSpeculator,
    OracleSpeculator,
    RandomSpeculator,
    ToyTarget,
)

pytestmark = pytest.mark.soak

VOCAB = 32
CALLS = int(os.environ.get("TSSPEC_SOAK_CALLS", "5000"))
SECONDS = float(os.environ.get("TSSPEC_SOAK_SECONDS", "0") or 0)
SEED = int(os.environ.get("TSSPEC_SOAK_SEED", "20261129"))
WARMUP_SHARE = 0.1
MIN_WARMUP = 100
RSS_TOLERANCE_BYTES = 24 << 20
TRUNKS = {
    "snapshots": dict(per_row_snapshots=True),
    "reforward": dict(per_row_snapshots=False),
    "kv": dict(recurrent=False),
}
TARGET_SEEDS = (0, 1, 2, 3)
TWO_TURN_SHARE = 0.1
FAKES = ("oracle", "random", "adversarial")
MAX_PROMPT = 40
MAX_NEW_TOKENS = 32
STOP_SHARE = 0.15
# the block drafter on the toy costs ~3x a call of the others: drawn less often, still hundreds
ALGORITHM_WEIGHTS = {"block": 0.5}
BLOCK_DRAFTER = dict(hidden_size=16, mask_token_id=31, num_layers=1, block_size=6, sliding_window=8)



def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@attrs.frozen
class Case:
    index: int
    algorithm: str
    trunk: str
    target_seed: int
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    draft: int
    adaptive: bool
    stop: tuple[str, ...]
    detail: str = ""  # adversarial mode, head kind...


def random_prompt(rng: random.Random) -> list[int]:
    kind = rng.random()
    n = rng.randint(1, MAX_PROMPT)
    if kind < 0.4:  # periodic: n-gram lookup finds matches
        period = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
        return [period[i % len(period)] for i in range(n)]
    if kind < 0.7:  # a repeated phrase with noise
        phrase = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 10))]
        out = []
        while len(out) < n:
            out += phrase if rng.random() < 0.7 else [rng.randrange(VOCAB)]
        return out[:n]
    return [rng.randrange(VOCAB) for _ in range(n)]


def random_sampling(rng: random.Random) -> SamplingParams:
    if rng.random() < 0.5:
        return SamplingParams(repeat_penalty=rng.choice([1.0, 1.0, 1.3]))
    return SamplingParams(
        temperature=rng.choice([0.3, 0.7, 1.0, 1.5]),
        top_k=rng.choice([0, 0, 5, 20]),
        top_p=rng.choice([1.0, 0.9, 0.5]),
        min_p=rng.choice([0.0, 0.0, 0.05]),
        repeat_penalty=rng.choice([1.0, 1.0, 1.1]),
        seed=rng.randrange(1 << 30),
    )


class Pools:
    """Targets reused across calls (generation must leave nothing behind that matters), one pool
    per (what is attached, trunk regime, seed); plain references on their own targets."""

    def __init__(self, catalog, drafter_files: dict[str, Path]):
        self.catalog = catalog
        self.drafter_files = drafter_files
        self.targets: dict[tuple, ToyTarget] = {}

    def plain(self, trunk: str, seed: int) -> ToyTarget:
        return self._get(("plain", trunk, seed), lambda: ToyTarget(seed=seed, **TRUNKS[trunk]))

    def for_algorithm(self, algorithm: str, detail: str, trunk: str, seed: int) -> ToyTarget:
        def make():
            target = ToyTarget(seed=seed, **TRUNKS[trunk])
            if algorithm == "draft-head":
                from tsspec_model_toy.heads import ToyPerTokenHead

                oracle = ToyTarget(seed=seed, **TRUNKS[trunk]) if detail == "oracle-head" else None
                scale = dict(oracle_scale=4.0) if oracle is not None else dict(logit_scale=6.0)
                target.draft_head = ToyPerTokenHead.for_target(target, oracle_target=oracle, seed=seed, **scale)
            elif algorithm == "block":
                from tsspec.runtime.loading import LoadOptions, attach_drafter

                attach_drafter(target, self.drafter_files[trunk], LoadOptions(), self.catalog)
            return target

        return self._get((algorithm, detail, trunk, seed), make)

    def _get(self, key, make):
        if key not in self.targets:
            self.targets[key] = make()
        return self.targets[key]


def write_block_drafters(tmp_path) -> dict[str, Path]:
    """Random DFlash drafters for the toy (taps must exist in each trunk regime)."""
    try:
        from tsspec_block.random_drafter import write_random_dflash
    except ImportError:
        return {}
    files = {}
    for trunk in TRUNKS:
        taps = [0, 1] if trunk == "kv" else [1, 2]
        files[trunk] = write_random_dflash(tmp_path / f"dflash-{trunk}.gguf", vocab_size=VOCAB,
                                           target_layers=taps, **BLOCK_DRAFTER)
    return files


def serving_algorithms(catalog, pools: Pools) -> tuple[list[str], dict[str, str]]:
    """The registered algorithms that serve the toy (with what they need attached), and why the
    others do not."""
    serving, skipped = [], {}
    for name in catalog.speculators.names():
        detail = "oracle-head" if name == "draft-head" else ""
        try:
            target = pools.for_algorithm(name, detail, "reforward", 0)
        except Exception as exc:  # e.g. a drafter that cannot attach to the toy
            skipped[name] = f"{type(exc).__name__}: {exc}"
            continue
        made = catalog.speculators.create(target, SpeculationOptions(spec_type=name))
        if hasattr(made, "code"):
            skipped[name] = f"{made.code}: {made.reason}"
        else:
            made.close()
            serving.append(name)
    return serving, skipped


def make_speculator(case: Case, target, catalog, plain_continuation: list[int]):
    if case.algorithm == "oracle":
        return OracleSpeculator(list(case.prompt) + plain_continuation, corrupt=float(case.detail),
                                vocab_size=VOCAB, max_draft_tokens=case.draft, seed=case.index)
    if case.algorithm == "random":
        return RandomSpeculator(VOCAB, max_draft_tokens=case.draft, seed=case.index)
    if case.algorithm == "adversarial":
        return AdversarialSpeculator(VOCAB, case.detail, sequence=list(case.prompt) + plain_continuation,
                                     max_draft_tokens=case.draft, delay_s=0.0)
    made = catalog.speculators.create(target, SpeculationOptions(spec_type=case.algorithm, draft=case.draft,
                                                                 adaptive=case.adaptive))
    assert not hasattr(made, "code"), f"{case.algorithm} declined mid-run: {made}"
    return made


def draw_case(rng: random.Random, index: int, algorithms: list[str]) -> Case:
    weights = [ALGORITHM_WEIGHTS.get(a, 1.0) for a in algorithms]
    algorithm = rng.choices(algorithms, weights)[0]
    detail = ""
    if algorithm == "oracle":
        detail = str(rng.choice([0.0, 0.1, 0.5, 1.0]))
    elif algorithm == "adversarial":
        detail = rng.choice(ADVERSARIAL_MODES)
    elif algorithm == "draft-head":
        detail = rng.choice(["oracle-head", "wrong-head"])
    stop = ()
    if rng.random() < STOP_SHARE:  # one or two characters of the toy alphabet: they do occur
        stop = ("".join(rng.choice("abcdefghijklmnopqrstuvwxyz?!") for _ in range(rng.randint(1, 2))),)
    return Case(
        index=index,
        algorithm=algorithm,
        trunk=rng.choice(sorted(TRUNKS)),
        target_seed=rng.choice(TARGET_SEEDS),
        prompt=tuple(random_prompt(rng)),
        max_tokens=rng.randint(1, MAX_NEW_TOKENS),
        sampling=random_sampling(rng),
        draft=rng.randint(1, 12),
        adaptive=rng.random() < 0.5,
        stop=stop,
        detail=detail,
    )


def run_one(case: Case, pools: Pools, catalog) -> tuple[object, object]:
    plain = generate(pools.plain(case.trunk, case.target_seed), list(case.prompt),
                     SpeculationOptions(enabled=False), max_tokens=case.max_tokens, sampling=case.sampling,
                     stop=case.stop)
    target = pools.for_algorithm(case.algorithm, case.detail, case.trunk, case.target_seed)
    speculator = make_speculator(case, target, catalog, plain.tokens)
    pieces: list[str] = []
    spec = generate(target, list(case.prompt), SpeculationOptions(draft=case.draft, adaptive=case.adaptive),
                    max_tokens=case.max_tokens, sampling=case.sampling, speculator=speculator, stop=case.stop,
                    on_token=lambda tok, piece: pieces.append(piece) and None)
    assert spec.tokens == plain.tokens, f"call {case}: speculative {spec.tokens} != plain {plain.tokens}"
    assert spec.text == plain.text and "".join(pieces) == spec.text, f"call {case}: text differs"
    return plain, spec


def run_two_turns(case: Case, pools: Pools, catalog, rng: random.Random) -> object:
    """Two requests on one loop over a rewindable (pure KV) trunk: the second reuses the cached
    prefix of the first (prompt + answer + a follow-up)."""
    case = attrs.evolve(case, trunk="kv")
    target = ToyTarget(seed=case.target_seed, **TRUNKS["kv"])
    first_plain = generate(pools.plain("kv", case.target_seed), list(case.prompt), SpeculationOptions(enabled=False),
                           max_tokens=case.max_tokens, sampling=case.sampling).tokens
    follow = list(case.prompt) + first_plain + random_prompt(rng)[:12]
    second_plain = generate(pools.plain("kv", case.target_seed), follow, SpeculationOptions(enabled=False),
                            max_tokens=case.max_tokens, sampling=case.sampling).tokens
    if case.algorithm in FAKES:
        speculator = make_speculator(case, target, catalog, first_plain)
    else:
        speculator = make_speculator(case, pools.for_algorithm(case.algorithm, case.detail, "kv", case.target_seed),
                                     catalog, first_plain)
        target = pools.for_algorithm(case.algorithm, case.detail, "kv", case.target_seed)
    loop = SpeculativeExecution(target, Sampler(case.sampling), vocab_size=VOCAB,
                                speculator=speculator, window=case.draft)
    first = loop.run(list(case.prompt), case.max_tokens)
    second = loop.run(follow, case.max_tokens)
    speculator.close()
    assert first == first_plain and second == second_plain, f"two-turn call {case} differs from plain"
    return loop.stats


def test_soak(tmp_path):
    from tsspec.plugins import PluginHost
    from tsspec.runtime.catalog import build_catalog

    logging.getLogger("tsspec").setLevel(logging.ERROR)  # fault warnings are expected by the thousand
    catalog = build_catalog(PluginHost())
    pools = Pools(catalog, write_block_drafters(tmp_path))
    registered, skipped = serving_algorithms(catalog, pools)
    assert "ngram" in registered, f"ngram must serve the toy; skipped: {skipped}"
    algorithms = registered + list(FAKES)
    rng = random.Random(SEED)
    warmup = max(MIN_WARMUP, int(CALLS * WARMUP_SHARE))
    counts: dict[str, int] = {}
    totals = dict(tokens=0, draft_tokens=0, accepted=0, faults=0, parked=0, two_turn=0, stopped=0)
    rss_start = rss_peak = 0
    rss_marks: list[tuple[int, int]] = []
    started = time.perf_counter()
    done = 0
    for index in range(CALLS):
        if SECONDS and time.perf_counter() - started > SECONDS and index > warmup:
            break
        case = draw_case(rng, index, algorithms)
        counts[case.algorithm] = counts.get(case.algorithm, 0) + 1
        if rng.random() < TWO_TURN_SHARE:
            stats = run_two_turns(case, pools, catalog, rng)
            totals["two_turn"] += 1
        else:
            plain, spec = run_one(case, pools, catalog)
            stats = spec.stats
            totals["stopped"] += spec.finish_reason == "stop"
        totals["tokens"] += stats.emitted_tokens
        totals["draft_tokens"] += stats.draft_tokens
        totals["accepted"] += stats.accepted_tokens
        totals["faults"] += stats.faults
        totals["parked"] += stats.speculator_parked
        done += 1
        if index + 1 == warmup:
            gc.collect()
            rss_start = rss_bytes()
        if index + 1 > warmup and (index + 1) % 250 == 0:
            gc.collect()
            rss_marks.append((index + 1, rss_bytes()))
            rss_peak = max(rss_peak, rss_marks[-1][1])
    elapsed = time.perf_counter() - started
    gc.collect()
    rss_end = rss_bytes()
    growth = rss_end - rss_start
    print(
        f"\n[soak] {done} calls in {elapsed:.0f} s, 0 mismatches; algorithms {dict(sorted(counts.items()))}; "
        f"not serving the toy: {skipped or 'none'}\n"
        f"[soak] tokens {totals['tokens']}, drafted {totals['draft_tokens']}, accepted {totals['accepted']}, "
        f"faults caught {totals['faults']}, sequences parked {totals['parked']}, two-turn {totals['two_turn']}, "
        f"stopped by a stop string {totals['stopped']}\n"
        f"[soak] RSS after {warmup} warm-up calls {rss_start / 2**20:.1f} MiB, end {rss_end / 2**20:.1f} MiB, "
        f"growth {growth / 2**20:+.1f} MiB (tolerance {RSS_TOLERANCE_BYTES / 2**20:.0f} MiB); marks "
        + ", ".join(f"{i}:{r / 2**20:.1f}" for i, r in rss_marks[:: max(1, len(rss_marks) // 10)])
    )
    assert done > warmup
    assert totals["accepted"] > 0 and totals["faults"] > 0
    assert growth <= RSS_TOLERANCE_BYTES, f"RSS grew by {growth / 2**20:.1f} MiB over the run"
