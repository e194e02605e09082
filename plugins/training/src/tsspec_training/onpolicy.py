"""On-policy training data: the target's own greedy and sampled answers, many per forward.

``prompt_mix`` builds a seeded, class-labelled prompt list (chat turns, explanations, prose,
math word problems, code) from the generator in ``prompts`` crossed wider (every template with
every topic, system prompts on some chat turns), keeping out held-out prompts and benchmark
turns. ``onpolicy_answers`` answers each prompt under each MODE (``greedy``, or ``sample-S``:
temperature 0.8, top-p 0.95, seed S, drawn with the core's position-seeded sampler) on the
target's paged path, up to ``batch`` sequences per forward, and appends every answer to a JSONL
cache as it finishes: a later run with more prompts or modes extends the cache, it never redoes
it. ``answer_rate`` times the same target answering one prompt at a time, for the comparison.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import prompts as gen

__all__ = ["MIX_LICENSES", "prompt_mix", "onpolicy_answers", "answer_rate", "read_cache", "mode_sampler", "feature_layers", "load_features"]

TEMPERATURE, TOP_P = 0.8, 0.95

SYSTEMS = [
    "You are a helpful assistant.",
    "You are a friendly tutor. Explain things clearly and simply.",
    "You are a concise assistant. Keep answers short.",
    "You solve arithmetic word problems. Show every step, then give the final answer.",
    "You are a careful Python programmer.",
    "You are a writer who uses plain, vivid words.",
]

# where each class's prompt text comes from, and under which terms (the manifest's record)
MIX_LICENSES = {
    "chat": "templates and topics written in tsspec_training.prompts (project license)",
    "explanation": "templates and topics written in tsspec_training.prompts (project license)",
    "prose": "templates and topics written in tsspec_training.prompts (project license)",
    "math": "word problems generated from seeded numbers in tsspec_training.prompts (project license)",
    "code": "tasks written in tsspec_training.prompts, and functions/docstrings of the Python "
            "standard library on the training machine (PSF-2.0)",
    "answers": "the target model's own output (its license)",
}


MATH_PROMPTS, LOCAL_TEXTS = 600, 200  # pool sizes: fixed, so a smaller count is a prefix of a larger


def prompt_mix(count: int, seed: int = 0) -> list[dict]:
    """``count`` training prompts [{"class", "system", "prompt"}], classes interleaved in a seeded
    order; never a held-out prompt (``prompts.is_held_out``) or a benchmark turn. The mix of a
    smaller count is the first part of a larger one's (a cache made for one serves the other)."""
    rng = random.Random(seed)
    topics = list(gen.TOPICS)
    by_class: dict[str, list[tuple[str, str]]] = {c: [] for c in ("chat", "explanation", "prose", "math", "code")}
    for tpl in gen.TEMPLATES:
        kind = "prose" if ("poem" in tpl or "story" in tpl or "email" in tpl) else "explanation"
        by_class[kind] += [("", tpl.format(t=t)) for t in topics]
    for tpl in gen.PROSE_TASKS:
        by_class["prose"] += [("", tpl.format(t=t)) for t in topics]
    for tpl in gen.LIST_TASKS:
        by_class["explanation"] += [("", tpl.format(t=t, u=rng.choice([x for x in topics if x != t]))) for t in topics]
    for tpl in gen.CHAT_TASKS:
        by_class["chat"] += [(rng.choice(SYSTEMS[:3] + [""]), tpl.format(t=t)) for t in topics]
    by_class["chat"] += [(rng.choice(SYSTEMS[:3]), tpl.format(t=t)) for tpl in gen.TEMPLATES[:6] for t in topics]
    by_class["math"] += [(rng.choice([SYSTEMS[3], ""]), p) for p in gen._math_prompts(rng, MATH_PROMPTS)]
    by_class["code"] += [(rng.choice([SYSTEMS[4], ""]), p) for p in gen.CODE_TASKS + gen.MORE_CODE_TASKS]
    docs, code = gen._local_texts(rng, LOCAL_TEXTS)
    by_class["code"] += [("", rng.choice(gen.CODE_EDIT_TASKS).format(code=c)) for c in code]
    by_class["explanation"] += [("", rng.choice(gen.DOC_TASKS).format(doc=d)) for d in docs]
    bench = gen._bench_texts()
    pools = {}
    for name, items in by_class.items():
        seen, kept = set(), []
        for system, prompt in items:
            if prompt in seen or gen.is_held_out(prompt) or prompt in bench:
                continue
            seen.add(prompt)
            kept.append({"class": name, "system": system, "prompt": prompt})
        rng.shuffle(kept)
        pools[name] = kept
    out: list[dict] = []
    while len(out) < count and any(pools.values()):
        for name in list(pools):
            if pools[name] and len(out) < count:
                out.append(pools[name].pop())
    return out


def _key(rec: dict) -> str:
    return f"{rec['mode']}\x00{rec['system']}\x00{rec['prompt']}"


def read_cache(path: Path) -> list[dict]:
    """Every record of an answers cache (a torn last line, from an interrupted run, is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text("utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def mode_sampler(mode: str, prompt: str = ""):
    """The core's sampler for a MODE: ``greedy`` or ``sample-S`` (seeded by S and the prompt's
    sha256, so no two prompts share their draws)."""
    import hashlib

    from tsspec import Sampler, SamplingParams

    if mode == "greedy":
        return Sampler(SamplingParams())
    if mode.startswith("sample-") and mode[7:].isdigit():
        salt = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:4], "little")
        return Sampler(SamplingParams(temperature=TEMPERATURE, top_p=TOP_P, seed=int(mode[7:]) * (1 << 32) + salt))
    raise ValueError(f"answer mode must be greedy or sample-SEED, got {mode!r}")


def _ids(tok, rec: dict) -> list[int]:
    if rec.get("prompt_ids"):  # given ids (a target without a tokenizer)
        return list(rec["prompt_ids"])
    messages = ([{"role": "system", "content": rec["system"]}] if rec["system"] else []) + [
        {"role": "user", "content": rec["prompt"]}]
    return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)


def feature_layers(num_layers: int) -> tuple[int, int, int]:
    """The low, middle and high taps an EAGLE-3-style head reads: the residuals entering layer 2,
    the middle layer, and the final residual (before the output norm)."""
    return (min(2, num_layers // 3), num_layers // 2, num_layers)


def onpolicy_answers(
    target,
    mix: Sequence[dict],
    cache_dir: Path,
    *,
    modes: Sequence[str] = ("greedy", "sample-1"),
    max_new_tokens: int = 256,
    batch: int = 16,
    taps: Sequence[int] | None = None,
    shard_size: int = 16,
    log: Callable[[str], None] = lambda line: None,
) -> list[dict]:
    """Each (prompt, mode)'s ids and answer, cached under ``cache_dir``: ``answers.jsonl`` (one
    record per answer, appended once its shard is written; those there are not answered again)
    and, with ``taps``, ``features-N.pt`` shards holding each answer's tapped feature rows
    [P + n - 1, F] float16 and the target's argmax at each answer row [n]. Prompt by prompt,
    every mode in turn, so a stopped run keeps the mix balanced. Returns the cached records of
    ``mix`` x ``modes``."""
    from .answers import batched_answers
    from .teacher import _eos_ids

    cache_dir = Path(cache_dir)
    index = cache_dir / "answers.jsonl"
    for m in modes:
        mode_sampler(m)  # a bad mode fails before any work
    done = {_key(r): r for r in read_cache(index)}
    want = tuple(taps) if taps else None
    todo = [dict(rec, mode=m) for rec in mix for m in modes if _key(dict(rec, mode=m)) not in done]
    cache_dir.mkdir(parents=True, exist_ok=True)
    tok = target.tokenizer
    ids = [_ids(tok, rec) for rec in todo]
    samplers = [mode_sampler(rec["mode"], rec["system"] + "\x00" + rec["prompt"]) for rec in todo]
    began, made = time.perf_counter(), 0
    shard: dict[str, dict] = {}
    shards = len(list(cache_dir.glob("features-*.pt")))
    pending: list[dict] = []

    def flush(handle) -> None:
        nonlocal shard, shards, pending
        if not pending:
            return
        name = None
        if want:
            name = f"features-{shards:05d}.pt"
            torch.save(shard, cache_dir / (name + ".tmp"))
            (cache_dir / (name + ".tmp")).rename(cache_dir / name)
            shards += 1
        for rec in pending:
            rec["shard"] = name
            handle.write(json.dumps(rec) + "\n")
            done[_key(rec)] = rec
        handle.flush()
        shard, pending = {}, []

    features: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    with open(index, "a", encoding="utf-8") as handle:

        def write(i: int, answer: list[int]) -> None:
            nonlocal made
            rec = dict(todo[i], prompt_ids=ids[i], answer_ids=list(answer), taps=list(want) if want else None)
            if want:
                hidden, argmax = features.pop(i)
                shard[_key(rec)] = {"hidden": hidden.clone(), "argmax": argmax}
            pending.append(rec)
            made += len(answer)
            if len(pending) >= shard_size:
                flush(handle)
                seconds = time.perf_counter() - began
                log(f"on-policy answers: {len(done)} cached, {made} new tokens in {seconds:.0f}s "
                    f"({made / max(seconds, 1e-9):.1f} tokens/s batched)")

        def keep(i: int, hidden: torch.Tensor, argmax: torch.Tensor) -> None:
            features[i] = (hidden, argmax)

        def pick(i: int, logits: torch.Tensor, position: int, preceding: Sequence[int]) -> int:
            return samplers[i].sample(logits, position, preceding)

        if todo:
            if want:
                target.spec_set_feature_taps(list(want))
            try:
                # on_done runs before on_features: hold the answer until its rows arrive
                answers: dict[int, list[int]] = {}

                def done_answer(i: int, answer: list[int]) -> None:
                    if want:
                        answers[i] = answer
                    else:
                        write(i, answer)

                def done_rows(i: int, hidden: torch.Tensor, argmax: torch.Tensor) -> None:
                    keep(i, hidden, argmax)
                    write(i, answers.pop(i))

                answered = batched_answers(target, ids, max_new_tokens, eos=_eos_ids(target), batch=batch,
                                           on_done=done_answer, pick=pick, on_features=done_rows if want else None)
                if answered is None:  # no paged path: one prompt at a time, the same answers
                    for i in range(len(todo)):
                        answer, hidden, argmax = _one_answer(target, ids[i], max_new_tokens, _eos_ids(target),
                                                             lambda *a, i=i: pick(i, *a[1:]), bool(want))
                        done_answer(i, answer)
                        if want:
                            done_rows(i, hidden, argmax)
            finally:
                if want:
                    target.spec_set_feature_taps(None)
            flush(handle)
    if todo:
        seconds = time.perf_counter() - began
        log(f"on-policy answers: {len(todo)} written, {made} tokens in {seconds:.0f}s "
            f"({made / max(seconds, 1e-9):.1f} tokens/s, batch {batch})")
        with open(cache_dir / "runs.jsonl", "a", encoding="utf-8") as runs:  # the manifest's generation figures
            runs.write(json.dumps({"answers": len(todo), "tokens": made, "seconds": round(seconds, 1),
                                   "batch": batch, "threads": torch.get_num_threads()}) + "\n")
    return [done[_key(dict(rec, mode=m))] for rec in mix for m in modes if _key(dict(rec, mode=m)) in done]


@torch.inference_mode()
def _one_answer(target, prompt: Sequence[int], max_new_tokens: int, eos: frozenset[int], pick, want_hidden: bool):
    """(answer, hidden [P + n - 1, F] float16 or None, argmax [n]) of one prompt, one row per
    forward on the target's own cache: ``batched_answers``'s result for one sequence."""
    target.spec_rewind_cache(0)
    target.spec_ensure_capacity(len(prompt) + max_new_tokens + 1)
    logits, hidden = target.spec_forward(list(prompt), all_logits_rows=False, want_hidden=want_hidden)
    rows, answer, argmax = [hidden], [], []
    while True:
        position = len(prompt) + len(answer)
        token = pick(0, logits[-1], position, list(prompt) + answer)
        argmax.append(int(torch.argmax(logits[-1]).item()))
        answer.append(token)
        if token in eos or len(answer) >= max_new_tokens:
            break
        logits, hidden = target.spec_forward([token], all_logits_rows=False, want_hidden=want_hidden)
        rows.append(hidden)
    target.spec_rewind_cache(0)
    hidden = torch.cat(rows, dim=0).to(torch.float16) if want_hidden else None
    return answer, hidden, torch.tensor(argmax, dtype=torch.long)


def load_features(cache_dir: Path, records: Sequence[dict]) -> list[dict]:
    """Each record with its shard's rows: ``hidden`` [P + n - 1, F] float16, ``argmax`` [n]."""
    cache_dir = Path(cache_dir)
    by_shard: dict[str, list[dict]] = {}
    for rec in records:
        if rec.get("shard"):
            by_shard.setdefault(rec["shard"], []).append(rec)
    out = []
    for name, recs in by_shard.items():
        data = torch.load(cache_dir / name)
        for rec in recs:
            out.append(dict(rec, **data[_key(rec)]))
    return out


@torch.inference_mode()
def answer_rate(target, mix: Sequence[dict], *, max_new_tokens: int, batch: int) -> float:
    """Answer tokens per second answering ``mix`` greedily, ``batch`` at a time (1: one prompt at
    a time, one row per forward). Nothing is cached: this is the comparison's timing."""
    from .answers import batched_answers
    from .teacher import _eos_ids, greedy_answer

    ids = [_ids(target.tokenizer, rec) for rec in mix]
    began = time.perf_counter()
    if batch == 1:
        answers = [greedy_answer(target, p, max_new_tokens) for p in ids]
    else:
        answers = batched_answers(target, ids, max_new_tokens, eos=_eos_ids(target), batch=batch) or []
    return sum(len(a) for a in answers) / max(time.perf_counter() - began, 1e-9)
