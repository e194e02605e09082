"""Peers run side by side on the same GGUF, prompt ids and token budget: optional comparisons.

* ``transformers``: ``generate()`` greedy, plain and with ``prompt_lookup_num_tokens`` (its
  prompt-lookup decoding), on the model dequantised from the same GGUF.
* ``llama.cpp`` through ``llama-cpp-python``: plain, and with its prompt-lookup draft model
  (``LlamaPromptLookupDecoding``, with ``logits_all=True``: see peer_worker.py).

Every peer runs in its own process (``peer_worker.py``, started by ``PeerProcess``) with the
environment tsspec was started with minus the OpenMP wait/thread settings (``PEER_ENV_DROP``):
llama.cpp's ggml and torch both use OpenMP, and a setting such as ``OMP_WAIT_POLICY=PASSIVE``
cuts llama.cpp's decode speed to a third (measured: 104 -> 35 tok/s). Threads = the cores this
process may use, for decoding and for batches.

llama.cpp offers several documented ways to run the same request (the ``generate`` and
``create_completion`` APIs, flash attention off / on), and both peers' prompt lookup takes a
draft length (default 10): ``tune`` probes them on one prompt and the bench then uses the
fastest plain and the fastest prompt-lookup variant (its figures are the peer's best, not its
defaults). Each peer run is paired with the tsspec run of the same prompt and
round (the bench calls the peer right after it), so "tsspec / peer" is a median of paired ratios.

Neither peer is a tsspec dependency: a missing package is a one-line error naming the command
that installs it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import attrs

from tsspec.errors import TsspecError
from .peer_worker import BEST, LOOKUP, MISSING_HINT, PLAIN, PROMPT_LOOKUP_TOKENS, decode_rate, draft_tokens  # noqa: F401

LLAMA_CPP_BUILD_HINT = MISSING_HINT["llama.cpp"]
PEER_NAMES = ("transformers", "llama.cpp")
# settings that change how an OpenMP pool waits or how many threads it runs: a peer gets its
# engine's defaults, never what tsspec's process (or the shell that started it) chose
PEER_ENV_DROP = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "OMP_PROC_BIND", "OMP_PLACES")
TUNE_TOKENS = 48  # new tokens per probe run
TUNE_REPS = 2
TUNE_SECONDS = 3.0  # a probe run also ends after this long: a variant that slow has lost anyway
# (tokens, reps) of the probe per engine where it differs: transformers decodes at ~1/6 of the
# others' speed, so its probe is shorter (its figures are context, not a goal's partner)
TUNE_SETTINGS = {"transformers": (32, 1)}


def _other_fields(variant: str) -> tuple[str, ...]:
    """A variant's fields other than its draft length: ``prompt-lookup/generate/fa0/n3`` ->
    ('prompt-lookup', 'generate', 'fa0')."""
    return tuple(f for f in variant.split("/") if not (f[:1] == "n" and f[1:].isdigit()))


class PeerUnavailable(TsspecError):
    """A peer that cannot run here (package missing, model file unusable)."""


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# tsspec's own settings, which its CLI publishes into its environment (SpeculationOptions.publish)
PEER_ENV_DROP_PREFIXES = ("TS_SPEC_", "TS_MTP_", "TSSPEC_")


def peer_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a peer process starts with: ``base`` (default: this process's) without
    the OpenMP settings in PEER_ENV_DROP and without tsspec's own settings."""
    env = dict(os.environ if base is None else base)
    for key in [*PEER_ENV_DROP, *(k for k in env if k.startswith(PEER_ENV_DROP_PREFIXES))]:
        env.pop(key, None)
    return env


class PeerProcess:
    """One peer engine in a child process (see peer_worker.py for the line protocol)."""

    def __init__(self, name: str, gguf_path: str | Path, stop_tokens: Sequence[int], *, threads: int | None = None,
                 env: dict[str, str] | None = None):
        if name not in PEER_NAMES:
            raise PeerUnavailable(f"unknown peer {name!r}: choose from {', '.join(PEER_NAMES)}")
        if not Path(str(gguf_path)).is_file():
            raise PeerUnavailable(f"--compare {name} needs a GGUF model file (got {gguf_path})")
        self.engine = name
        self.stop_tokens = [int(t) for t in stop_tokens]
        self.threads = threads or usable_cores()
        self._stderr = tempfile.TemporaryFile()
        worker = Path(__file__).with_name("peer_worker.py")  # by path: the child imports no tsspec
        self._proc = subprocess.Popen(
            [sys.executable, str(worker), name, str(gguf_path), str(self.threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1,
            env=peer_environment() if env is None else env,
        )
        first = self._read()
        if "error" in first:
            self.close()
            raise PeerUnavailable(first["error"])
        ready = first["ready"]
        self.configs: list[str] = list(ready["configs"])
        self.info: dict = dict(ready["info"])
        self.environment: dict = dict(ready["environment"])
        # the variant used for each kind; tune() replaces these with the fastest
        lookup = self._variants(LOOKUP)
        default = [v for v in lookup if draft_tokens(v) in (None, PROMPT_LOOKUP_TOKENS)]  # the engine's own default
        self.chosen = {PLAIN: self._variants(PLAIN)[0], LOOKUP: (default or lookup)[0]}
        self.probe: list[dict] = []
        self.probe_errors: dict[str, str] = {}  # variants that failed in the probe: why (not used)
        self.probe_seconds: float | None = None  # how long tune() took

    def _variants(self, kind: str) -> list[str]:
        return [c for c in self.configs if c == kind or c.startswith(kind + "/")]

    def _read(self) -> dict:
        line = self._proc.stdout.readline() if self._proc.stdout else ""
        if not line:
            self._stderr.seek(0)
            tail = self._stderr.read().decode(errors="replace").strip().splitlines()[-3:]
            return {"error": f"{self.engine} worker exited (code {self._proc.poll()}): {' | '.join(tail) or 'no output'}"}
        return json.loads(line)

    def _ask(self, request: dict) -> dict:
        if self._proc.poll() is not None:
            raise PeerUnavailable(f"{self.engine} worker is not running")
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise PeerUnavailable(answer["error"])
        return answer

    def generate(self, config: str, prompt_ids: Sequence[int], max_tokens: int,
                 max_seconds: float | None = None, reuse_prompt: bool = False) -> tuple[list[int], float, float]:
        """(tokens, decode tok/s, seconds) of one greedy run; ``config`` is a kind (plain,
        prompt-lookup: the chosen variant) or a variant name; ``max_seconds`` also ends it;
        ``reuse_prompt`` lets the engine keep the previous run's prompt (probe runs only)."""
        variant = self.chosen.get(config, config)
        request = {"op": "generate", "config": variant, "prompt_ids": [int(t) for t in prompt_ids],
                   "max_tokens": int(max_tokens), "stop": self.stop_tokens}
        if max_seconds:
            request["max_seconds"] = float(max_seconds)
        if reuse_prompt:
            request["reuse_prompt"] = True
        a = self._ask(request)
        return [int(t) for t in a["tokens"]], float(a["tps"]), float(a["seconds"])

    def prefill(self, prompt_ids: Sequence[int], **settings) -> float:
        """Seconds to process the prompt (no generation)."""
        return float(self._ask({"op": "prefill", "prompt_ids": [int(t) for t in prompt_ids], **settings})["seconds"])

    def tune(self, prompt_ids: Sequence[int], *, lookup_prompt_ids: Sequence[int] | None = None,
             max_tokens: int | None = None, reps: int | None = None) -> list[dict]:
        """Probe the variants on one prompt and keep the fastest of each kind by median decode
        tok/s. Each stage alternates its variants (a warm-up round, then ``reps`` rounds):
        the plain variants; the prompt-lookup draft lengths (the other fields as the first
        variant's); then the other fields (API, flash attention) at the best draft length. The
        stages keep the probe short as the list of variants grows (20 prompt-lookup variants
        for llama.cpp, 8 of them probed). The prompt-lookup stages run on ``lookup_prompt_ids``
        when given (a prompt of the kind prompt lookup is compared on), else on ``prompt_ids``.
        A variant the engine answers with an error is dropped (``probe_errors``); the peer is
        unavailable only when its worker dies or every variant of a stage fails."""
        max_tokens = max_tokens or TUNE_SETTINGS.get(self.engine, (TUNE_TOKENS, TUNE_REPS))[0]
        reps = reps or TUNE_SETTINGS.get(self.engine, (TUNE_TOKENS, TUNE_REPS))[1]
        self.probe, self.probe_errors = [], {}
        started = time.perf_counter()
        plain = self._variants(PLAIN)
        if len(plain) > 1:
            self.chosen[PLAIN] = self._probe_stage("plain", plain, prompt_ids, max_tokens, reps)
        lookup = self._variants(LOOKUP)
        if len(lookup) > 1:
            first = _other_fields(lookup[0])
            lengths = [v for v in lookup if _other_fields(v) == first]
            ids = prompt_ids if lookup_prompt_ids is None else lookup_prompt_ids
            best = self._probe_stage("draft length", lengths, ids, max_tokens, reps) if len(lengths) > 1 else lookup[0]
            rest = [v for v in lookup if draft_tokens(v) == draft_tokens(best)]
            if len(rest) > 1:
                best = self._probe_stage("api and flash attention", rest, ids, max_tokens, reps)
            self.chosen[LOOKUP] = best
        if self.probe:
            self._ask({"op": "keep", "configs": sorted(set(self.chosen.values()))})
        self.probe_seconds = time.perf_counter() - started
        return self.probe

    def _probe_stage(self, stage: str, variants: Sequence[str], prompt_ids, max_tokens: int, reps: int) -> str:
        """Alternate ``variants`` (one warm-up round, then ``reps``); record and return the
        fastest by median decode tok/s."""
        seen: dict[str, list[float]] = {v: [] for v in variants}
        for rep in range(-1, reps):
            for v in variants:
                if v in self.probe_errors:
                    continue
                try:
                    _, tps, _ = self.generate(v, prompt_ids, max_tokens, TUNE_SECONDS, reuse_prompt=True)
                except PeerUnavailable as exc:
                    if self._proc.poll() is not None:
                        raise  # the worker died: the peer is gone, not one variant
                    self.probe_errors[v] = str(exc)  # this variant failed; the others may serve
                    continue
                if rep >= 0:
                    seen[v].append(tps)
        medians = {v: statistics.median(t) for v, t in seen.items() if t and v not in self.probe_errors}
        if not medians:
            raise PeerUnavailable(f"every {stage} variant failed: " + "; ".join(
                f"{v}: {self.probe_errors.get(v, 'no timed run')}" for v in variants))
        self.probe += [{"stage": stage, "variant": v, "tokens_per_second": round(m, 2)} for v, m in medians.items()]
        return max(medians, key=lambda v: medians[v])  # the first of equals, in the variants' order

    def close(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                proc.stdin.flush()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                proc.kill()
                proc.wait()
        self._stderr.close()

    def describe(self) -> dict:
        return {"engine": self.engine, "threads": self.threads, "chosen": dict(self.chosen), "probe": self.probe,
                "probe_errors": dict(self.probe_errors),
                "probe_seconds": None if self.probe_seconds is None else round(self.probe_seconds, 1),
                "info": self.info, "environment": self.environment}


def make_peer(name: str, gguf_path: str | Path, stop_tokens: Sequence[int]) -> PeerProcess:
    """The peer called ``name`` on ``gguf_path`` in its own process; PeerUnavailable otherwise."""
    return PeerProcess(name, gguf_path, stop_tokens)


@attrs.define
class PeerRecord:
    engine: str
    config: str  # plain | prompt-lookup
    case_id: str
    cls: str
    rep: int  # -1: warm-up
    tokens: list[int]
    tokens_per_second: float  # decode: (emitted - 1) / (last token time - first token time)
    seconds: float  # whole call, prefill included
    tsspec_prefix: int | None = None  # leading tokens equal to tsspec's plain output
    variant: str | None = None  # the engine's variant (llama.cpp: api and flash attention)
    tsspec_tps: float | None = None  # the paired tsspec run (same prompt, round and kind)
    tsspec_config: str | None = None

    def to_json(self) -> dict:
        return {
            "engine": self.engine, "config": self.config, "variant": self.variant, "case": self.case_id,
            "class": self.cls, "rep": self.rep, "emitted": len(self.tokens),
            "tokens_per_second": round(self.tokens_per_second, 3), "seconds": round(self.seconds, 3),
            "paired_tsspec": self.tsspec_config,
            "paired_tsspec_tokens_per_second": None if self.tsspec_tps is None else round(self.tsspec_tps, 3),
            "same_prefix_as_tsspec_plain": self.tsspec_prefix, "tokens": self.tokens,
        }


def run_peer_once(peer: PeerProcess, config: str, case, rep: int, *, tsspec_tps: float | None = None,
                  tsspec_config: str | None = None) -> PeerRecord:
    tokens, tps, seconds = peer.generate(config, case.prompt_ids, case.max_tokens)
    return PeerRecord(peer.engine, config, case.id, case.cls, rep, tokens, tps, seconds,
                      variant=peer.chosen.get(config, config), tsspec_tps=tsspec_tps, tsspec_config=tsspec_config)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two outputs share.

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@attrs.define
class PeerRow:
    """One engine x configuration x class cell."""

    engine: str
    config: str
    cls: str
    runs: int
    tokens_per_second: float  # median
    ratio_median: float | None  # prompt-lookup / the engine's own plain, per pair
    ratio_min: float | None
    ratio_max: float | None
    same_as_own_plain: int  # runs whose tokens equal the engine's plain run of the pair
    same_as_tsspec_plain: int  # runs whose tokens equal tsspec's plain reference
    tsspec_over_this: float | None = None  # median of paired tsspec tok/s / this tok/s
    tsspec_config: str | None = None  # the tsspec configuration it was paired with
    modes: dict[str, int] | None = None  # BEST rows: how many pairs each mode was the faster in

    def to_json(self) -> dict:
        data = attrs.asdict(self)
        data["class"] = data.pop("cls")
        for key in ("tokens_per_second", "ratio_median", "ratio_min", "ratio_max", "tsspec_over_this"):
            if data[key] is not None:
                data[key] = round(data[key], 4)
        return data


def best_pairs(records: Sequence[PeerRecord]) -> list[tuple[PeerRecord, PeerRecord, PeerRecord]]:
    """(plain, prompt-lookup, the faster of the two) per engine, prompt and round of timed runs:
    the peer's best mode for that pair. The prompt-lookup record carries the paired tsspec
    speculative run, which a BEST row compares with the faster mode.

    >>> fast = PeerRecord("e", LOOKUP, "c", "qa", 0, [1], 9.0, 1.0)
    >>> [best.config for _, _, best in best_pairs([PeerRecord("e", PLAIN, "c", "qa", 0, [1], 12.0, 1.0), fast])]
    ['plain']
    """
    plain = {(r.engine, r.case_id, r.rep): r for r in records if r.config == PLAIN and r.rep >= 0}
    out = []
    for r in records:
        partner = plain.get((r.engine, r.case_id, r.rep))
        if r.config == LOOKUP and r.rep >= 0 and partner is not None:
            out.append((partner, r, r if r.tokens_per_second > partner.tokens_per_second else partner))
    return out


def _best_row(engine: str, cls: str, pairs, references: dict[str, list[int]]) -> PeerRow | None:
    cell = [(p, lk, best) for p, lk, best in pairs if p.engine == engine and (cls == "all" or p.cls == cls)]
    if not cell:
        return None
    paired = [lk.tsspec_tps / best.tokens_per_second for _, lk, best in cell if lk.tsspec_tps and best.tokens_per_second]
    modes = {PLAIN: sum(best.config == PLAIN for *_, best in cell), LOOKUP: sum(best.config == LOOKUP for *_, best in cell)}
    return PeerRow(
        engine, BEST, cls, len(cell), statistics.median(best.tokens_per_second for *_, best in cell), None, None, None,
        sum(best.tokens == p.tokens for p, _, best in cell), sum(best.tokens == references.get(best.case_id) for *_, best in cell),
        statistics.median(paired) if paired else None, next((lk.tsspec_config for _, lk, _ in cell if lk.tsspec_config), None),
        modes,
    )


def summarise_peers(records: Sequence[PeerRecord], classes: Sequence[str], references: dict[str, list[int]]) -> list[PeerRow]:
    """Rows per engine, configuration and class (then 'all') over timed runs; BEST rows pair
    tsspec's speculative run with the faster of the peer's plain and prompt lookup, per pair."""
    rows = []
    engines = list(dict.fromkeys(r.engine for r in records))
    timed = [r for r in records if r.rep >= 0]
    for engine in engines:
        mine = [r for r in timed if r.engine == engine]
        plain = {(r.case_id, r.rep): r for r in mine if r.config == PLAIN}
        for cls in [*classes, "all"]:
            for config in (PLAIN, LOOKUP):
                cell = [r for r in mine if r.config == config and (cls == "all" or r.cls == cls)]
                if not cell:
                    continue
                ratios = []
                same_own = 0
                for r in cell:
                    partner = plain.get((r.case_id, r.rep))
                    if partner is not None:
                        same_own += r.tokens == partner.tokens
                        if config != PLAIN and partner.tokens_per_second:
                            ratios.append(r.tokens_per_second / partner.tokens_per_second)
                same_ts = sum(r.tokens == references.get(r.case_id) for r in cell)
                paired = [r.tsspec_tps / r.tokens_per_second for r in cell if r.tsspec_tps and r.tokens_per_second]
                rows.append(PeerRow(
                    engine, config, cls, len(cell), statistics.median(r.tokens_per_second for r in cell),
                    statistics.median(ratios) if ratios else None, min(ratios) if ratios else None,
                    max(ratios) if ratios else None, same_own, same_ts,
                    statistics.median(paired) if paired else None,
                    next((r.tsspec_config for r in cell if r.tsspec_config), None),
                ))
            best = _best_row(engine, cls, best_pairs(mine), references)
            if best is not None:
                rows.append(best)
    return rows
