"""Peers run side by side on the same GGUF, prompt ids and token budget: optional comparisons.

* ``transformers``: ``generate()`` greedy, plain and with ``prompt_lookup_num_tokens`` (its
  prompt-lookup decoding), on the model dequantised from the same GGUF.
* ``llama.cpp`` through ``llama-cpp-python``: plain, and with its prompt-lookup draft model
  (``LlamaPromptLookupDecoding``, which needs ``logits_all=True``).

Neither is a tsspec dependency: each is imported when asked for, with a one-line error naming
the package to install when it is missing. Both get the token ids tsspec encoded (chat template
included), so the three engines answer exactly the same request; each is timed over decoding
only (first emitted token to last), like tsspec's tok/s, and alternates plain / prompt lookup
in one process after a warm-up, like the main runner.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import attrs

from ..errors import TsspecError
from .prompts import EncodedCase

PLAIN, LOOKUP = "plain", "prompt-lookup"
PROMPT_LOOKUP_TOKENS = 10  # tokens per prompt-lookup draft, both peers (their usual setting)
LLAMA_CPP_BUILD_HINT = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
    "pip install llama-cpp-python==0.3.36"
)
PEER_NAMES = ("transformers", "llama.cpp")


class PeerUnavailable(TsspecError):
    """A peer that cannot run here (package missing, model file unusable)."""


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

    def to_json(self) -> dict:
        return {
            "engine": self.engine, "config": self.config, "case": self.case_id, "class": self.cls,
            "rep": self.rep, "emitted": len(self.tokens),
            "tokens_per_second": round(self.tokens_per_second, 3), "seconds": round(self.seconds, 3),
            "same_prefix_as_tsspec_plain": self.tsspec_prefix, "tokens": self.tokens,
        }


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


def _decode_rate(times: Sequence[float], counts: Sequence[int]) -> float:
    """tok/s after the first emitted token: tokens arriving after it over the time they took."""
    if len(times) < 2:
        return 0.0
    span = times[-1] - times[0]
    return (sum(counts) - counts[0]) / span if span > 0 else 0.0


class TransformersPeer:
    """Hugging Face transformers on the GGUF (dequantised to float32 on load: slow, once)."""

    engine = "transformers"

    def __init__(self, gguf_path: str | Path, stop_tokens: Sequence[int]):
        try:
            import transformers  # noqa: F401
            from transformers import AutoModelForCausalLM
        except ImportError:
            raise PeerUnavailable("--compare transformers needs the transformers package: pip install 'transformers>=5' accelerate") from None
        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # the bench draws its own progress
        path = Path(gguf_path)
        try:
            self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        except Exception as exc:
            raise PeerUnavailable(f"transformers cannot load {path}: {type(exc).__name__}: {exc}") from None
        self.model.eval()
        self.stop_tokens = [int(t) for t in stop_tokens]
        self.torch = torch

    def generate(self, config: str, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], float, float]:
        from transformers.generation.streamers import BaseStreamer

        times: list[float] = []
        counts: list[int] = []

        class _Clock(BaseStreamer):
            """Records when new tokens arrive (the first put is the prompt itself)."""

            def __init__(self):
                self.prompt_seen = False

            def put(self, value):
                if not self.prompt_seen:
                    self.prompt_seen = True
                    return
                times.append(time.perf_counter())
                counts.append(int(value.numel()))

            def end(self):
                pass

        ids = self.torch.tensor([list(prompt_ids)], dtype=self.torch.long)
        extra = {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS} if config == LOOKUP else {}
        start = time.perf_counter()
        with self.torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=self.torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                temperature=None, top_p=None, top_k=None, eos_token_id=self.stop_tokens or None,
                pad_token_id=(self.stop_tokens or [0])[0], streamer=_Clock(), **extra,
            )
        seconds = time.perf_counter() - start
        tokens = [int(t) for t in out[0, ids.shape[1]:]]
        return tokens, _decode_rate(times, counts), seconds

    def close(self) -> None:
        self.model = None


class LlamaCppPeer:
    """llama.cpp through llama-cpp-python: one plain context and one with prompt lookup."""

    engine = "llama.cpp"

    def __init__(self, gguf_path: str | Path, stop_tokens: Sequence[int], n_ctx: int = 2048):
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError:
            raise PeerUnavailable(f"--compare llama.cpp needs llama-cpp-python; on this CPU build it with {LLAMA_CPP_BUILD_HINT}") from None
        try:
            threads = len(os.sched_getaffinity(0))
        except AttributeError:
            threads = os.cpu_count() or 1
        common = dict(model_path=str(gguf_path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False, seed=0)
        try:
            self.models = {
                PLAIN: Llama(**common),
                LOOKUP: Llama(**common, logits_all=True,
                              draft_model=LlamaPromptLookupDecoding(num_pred_tokens=PROMPT_LOOKUP_TOKENS)),
            }
        except Exception as exc:
            raise PeerUnavailable(f"llama.cpp cannot load {gguf_path}: {type(exc).__name__}: {exc}") from None
        self.stop_tokens = set(int(t) for t in stop_tokens) | {int(self.models[PLAIN].token_eos())}

    def generate(self, config: str, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], float, float]:
        llm = self.models[config]
        llm.reset()  # no prefix reuse between runs: every run prefills, like tsspec's
        tokens: list[int] = []
        times: list[float] = []
        start = time.perf_counter()
        for tok in llm.generate(list(prompt_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            times.append(time.perf_counter())
            tokens.append(int(tok))
            if int(tok) in self.stop_tokens or len(tokens) >= max_tokens:
                break
        seconds = time.perf_counter() - start
        return tokens, _decode_rate(times, [1] * len(times)), seconds

    def close(self) -> None:
        for llm in self.models.values():
            try:
                llm.close()
            except Exception:
                pass
        self.models = {}


def make_peer(name: str, gguf_path: str | Path, stop_tokens: Sequence[int]):
    """The peer called ``name`` on ``gguf_path``; PeerUnavailable with the reason otherwise."""
    if name not in PEER_NAMES:
        raise PeerUnavailable(f"unknown peer {name!r}: choose from {', '.join(PEER_NAMES)}")
    if not Path(str(gguf_path)).is_file():
        raise PeerUnavailable(f"--compare {name} needs a GGUF model file (got {gguf_path})")
    if name == "transformers":
        return TransformersPeer(gguf_path, stop_tokens)
    return LlamaCppPeer(gguf_path, stop_tokens)


def run_peer(
    peer,
    cases: Sequence[EncodedCase],
    reps: int,
    *,
    on_run: Callable[[PeerRecord], None] | None = None,
) -> list[PeerRecord]:
    """Warm-up, then per case ``reps`` rounds of plain, prompt-lookup (alternating)."""
    records = []
    slots = [(0, -1, c) for c in (PLAIN, LOOKUP)] if cases else []
    slots += [(i, rep, c) for i in range(len(cases)) for rep in range(reps) for c in (PLAIN, LOOKUP)]
    for i, rep, config in slots:
        case = cases[i]
        tokens, tps, seconds = peer.generate(config, case.prompt_ids, case.max_tokens)
        record = PeerRecord(peer.engine, config, case.id, case.cls, rep, tokens, tps, seconds)
        records.append(record)
        if on_run is not None:
            on_run(record)
    return records


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

    def to_json(self) -> dict:
        data = attrs.asdict(self)
        data["class"] = data.pop("cls")
        for key in ("tokens_per_second", "ratio_median", "ratio_min", "ratio_max"):
            if data[key] is not None:
                data[key] = round(data[key], 4)
        return data


def summarise_peers(records: Sequence[PeerRecord], classes: Sequence[str], references: dict[str, list[int]]) -> list[PeerRow]:
    """Rows per engine, configuration and class (then 'all') over timed runs."""
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
                rows.append(PeerRow(
                    engine, config, cls, len(cell), statistics.median(r.tokens_per_second for r in cell),
                    statistics.median(ratios) if ratios else None, min(ratios) if ratios else None,
                    max(ratios) if ratios else None, same_own, same_ts,
                ))
    return rows
