"""``tsspec bench-serve``: figures of the serving engine (the scheduler the server runs).

Three measurements, each printed as a table (and written as Markdown / JSON on request):

1. Streams: aggregate tok/s (all tokens over the wall time from submission to the last token,
   prefill included) and p50 / p99 inter-token latency (gaps between a stream's tokens as they
   are emitted: the tokens of one verify arrive together, so the median gap of a stream that
   accepts drafts is ~0) and the mean time per output token after the first, at 1, 2, 4, 8 and
   16 concurrent streams, plain vs speculative (n-gram), paired: at every level the two modes
   alternate, each run on a fresh scheduler; medians over ``--reps`` and the ratio of medians.
   Beside them: one stream of ``generate`` on the first prompt, timed the same way (the
   reference of "plain / generate"), and llama.cpp at the same levels: its multi-slot
   ``llama-server --parallel N`` when built (``peer_server.py``), else llama-cpp-python with one
   slot, a lower bound.
2. Multi-turn chat with prefix reuse: one conversation of 4 input-grounded turns, each turn's
   prompt the whole conversation so far, so from turn 2 on a sequence adopts the cached KV of
   the earlier turns. Modes: speculation armed after reuse (n-gram opts in), the old refuse-all
   rule (never arm after reuse), and plain; paired per rep on a fresh scheduler each; tok/s per
   turn (decode speed of that turn) as medians. Outputs are identical in all modes (lossless):
   the command checks it.
3. Memory: RSS before and after ``--requests`` short requests in waves of 8, every third one
   cancelled after its first token (after a warm-up wave).

4. Per stream: one request at a time through the HTTP server (uvicorn on loopback, streamed,
   read by a client in the same process) against ``generate``, the call ``tsspec generate``
   makes, on the same prompt and settings, plain and n-gram; paired and alternating (each
   pair's order flips), a different prompt each pair; the ratio of each pair and their median.

5. Cross-request draft memory: the seeded agent trace (``trace.py``) one request at a time; its
   first half warms the server's pool (``ngram-pool``), its second half runs each request with
   the pool and with the per-request ``ngram``, paired and alternating, every answer checked
   equal; decode tok/s (tokens after the first over decode time) by mode and the median ratio of
   the pairs. Then the prose control: unrelated essays with the warmed pool against ``ngram``,
   beside a control row of ``ngram`` against itself (the spread of identical configurations).

Sections 1-3 and 5 send requests to the scheduler in-process (no HTTP), so those figures are the
engine's; section 4 includes HTTP, server-sent events and the event loop.
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import statistics
import textwrap
import threading
import time
from typing import Annotated, Any, Optional

import typer

COMMAND = "bench-serve"
STREAM_LEVELS = (1, 2, 4, 8, 16)
PER_STREAM_TOPICS = ("the bicycle", "the steam engine", "the printing press", "the telescope", "the compass",
                     "paper money", "the telephone", "the railway", "the microscope", "the camera")


def _rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _stream_prompts(n: int) -> list[str]:
    """Input-grounded requests (they quote their input), one per stream, all different."""
    sources = [textwrap.indent, textwrap.dedent, textwrap.shorten, json.dumps, statistics.median, statistics.mean,
               inspect.getdoc, inspect.cleandoc]
    out = []
    for i in range(n):
        code = inspect.getsource(sources[i % len(sources)])
        code = "\n".join(code.splitlines()[:8])
        out.append(f"Add type hints to this function and return the whole function unchanged otherwise.\n\n```python\n{code}\n```")
    return out


TURNS = (
    "Here is a function:\n\n```python\n{code}\n```\n\nAdd type hints to it and return the whole function.",
    "Now add a short docstring line at the top of the body and return the whole function again.",
    "Rename the function to `indent_lines` and return the whole function again.",
    "Return the final version of the function once more, exactly as it is now.",
)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]


class _Bench:
    def __init__(self, target, registry, kv_cache_mb: float):
        self.target = target
        self.registry = registry
        self.kv_cache_mb = kv_cache_mb
        self.tokenizer = target.tokenizer

    def per_stream(self, mode: str, reps: int, max_tokens: int) -> dict[str, Any]:
        """Section 4: (server tok/s, generate tok/s) pairs, alternating which runs first."""
        import http.client

        from tsspec import generate

        from .engine import ServeEngine

        engine = ServeEngine(self.target, model_id="bench", options=self.options(mode), registry=self.registry,
                             kv_cache_mb=self.kv_cache_mb, max_seqs=8)
        server = _LoopbackServer(engine)
        spec = {"type": "none" if mode == "plain" else "ngram"}

        def served(ids: list[int]) -> tuple[float, int]:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
            body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": True, "speculative": spec}
            start = time.perf_counter()
            conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            data = conn.getresponse().read()
            wall = time.perf_counter() - start
            conn.close()
            final = [json.loads(line[6:]) for line in data.decode().split("\n\n") if '"usage"' in line]
            n = final[-1]["usage"]["completion_tokens"]
            return n / wall, n

        def alone(ids: list[int]) -> tuple[float, int]:
            start = time.perf_counter()
            result = generate(self.target, ids, self.options(mode), max_tokens=max_tokens, registry=self.registry,
                              on_token=lambda tok, piece: None)
            return len(result.tokens) / (time.perf_counter() - start), len(result.tokens)

        pairs = []
        try:
            warm = self.chat_ids([{"role": "user", "content": "Say hello."}])
            served(warm), alone(warm)
            for rep in range(reps):
                topic = PER_STREAM_TOPICS[rep % len(PER_STREAM_TOPICS)]
                ids = self.chat_ids([{"role": "user", "content": f"Write a long essay about the history of {topic}."}])
                order = (served, alone) if rep % 2 == 0 else (alone, served)
                got = {f: f(ids) for f in order}
                if got[served][1] != got[alone][1]:
                    raise RuntimeError(f"the server emitted {got[served][1]} tokens, generate {got[alone][1]}")
                pairs.append({"server": got[served][0], "generate": got[alone][0], "tokens": got[alone][1]})
        finally:
            server.stop()
        ratios = [p["server"] / p["generate"] for p in pairs]
        return {"pairs": pairs, "server": statistics.median(p["server"] for p in pairs),
                "generate": statistics.median(p["generate"] for p in pairs), "ratio": statistics.median(ratios),
                "ratio_low": min(ratios), "ratio_high": max(ratios)}

    def scheduler(self, max_seqs: int = 8):
        from .scheduler import Scheduler

        return Scheduler(self.target, kv_cache_mb=self.kv_cache_mb, max_seqs=max_seqs, registry=self.registry).start()

    def chat_ids(self, messages) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def options(self, mode: str):
        from tsspec import SpeculationOptions

        return SpeculationOptions(enabled=False) if mode == "plain" else SpeculationOptions(spec_type="ngram")

    # -- 5. cross-request draft memory -------------------------------------------------------
    def trace(self, max_tokens: int, conversations: int, seed: int, prose: int, limit: int | None = None) -> dict[str, Any]:
        from tsspec import SpeculationOptions

        from .engine import ServeEngine
        from .memory import PoolStore
        from .pool_speculator import NAME as POOL
        from .scheduler import SequenceRequest
        from .trace import agent_trace, prose_prompts

        requests = agent_trace(seed, conversations)[:limit]
        engine = ServeEngine(self.target, model_id="bench", options=SpeculationOptions(spec_type="ngram"),
                             registry=self.registry, kv_cache_mb=self.kv_cache_mb, max_seqs=1,
                             memory=PoolStore("bench"))
        if POOL not in engine.spec_names or "ngram" not in engine.spec_names:
            raise RuntimeError(f"the trace section needs the ngram and {POOL} algorithms")
        engine.start()

        def run(ids: list[int], mode: str):
            options, _ = engine.memory_options(SpeculationOptions(spec_type=POOL if mode == "pool" else "ngram"))
            handle = engine.scheduler.submit_request(SequenceRequest(ids, max_tokens, options=options))
            handle.wait()
            if handle.result is None:
                raise RuntimeError(f"a trace request failed: {handle.error!r}")
            return handle.result

        def paired(prompts: list[list[int]], modes: tuple[str, ...], keep: bool) -> dict[str, Any]:
            sums = {m: [0, 0.0] for m in modes}  # tokens after the first, decode ms
            ratios: dict[str, list[float]] = {m: [] for m in modes[1:]}
            for i, ids in enumerate(prompts):
                if i % 10 == 0:
                    typer.echo(f"[trace] {'/'.join(modes)}: request {i + 1} of {len(prompts)}", err=True)
                order = modes[i % len(modes):] + modes[:i % len(modes)]
                got = {m: run(ids, m) for m in order}
                base = got[modes[0]]
                for m in modes:
                    if got[m].tokens != base.tokens:
                        raise RuntimeError(f"request {i}: {m} differs from {modes[0]}: not lossless")
                    sums[m][0] += max(0, len(got[m].tokens) - 1)
                    sums[m][1] += got[m].stats.decode_ms
                for m in modes[1:]:
                    a, b = got[m].stats.tokens_per_second, base.stats.tokens_per_second
                    if a > 0 and b > 0:
                        ratios[m].append(a / b)
                if keep:
                    engine.remember("", ids + list(base.tokens))
            rate = {m: 1000.0 * n / ms if ms else 0.0 for m, (n, ms) in sums.items()}
            return {"requests": len(prompts), "tok_s": rate, "tokens": {m: n for m, (n, _) in sums.items()},
                    "ratio": {m: statistics.median(r) if r else float("nan") for m, r in ratios.items()},
                    "low": {m: min(r) if r else float("nan") for m, r in ratios.items()},
                    "high": {m: max(r) if r else float("nan") for m, r in ratios.items()}}

        try:
            ids = [self.chat_ids(list(r.messages)) for r in requests]
            half = len(ids) // 2
            for i in range(half):  # the warm half: the pool learns, nothing is measured
                if i % 10 == 0:
                    typer.echo(f"[trace] warming: request {i + 1} of {half}", err=True)
                engine.remember("", ids[i] + list(run(ids[i], "pool").tokens))
            measured = paired(ids[half:], ("ngram", "pool"), keep=True)
            essays = [self.chat_ids(m) for m in prose_prompts(prose)]
            control = paired(essays, ("ngram", "ngram-again", "pool"), keep=False)
            pool = engine.memory.pool("")
        finally:
            engine.close()
        return {"requests": len(ids), "conversations": conversations, "seed": seed, "warm": half, "limit": limit,
                "measured": measured, "prose": control, "pool_entries": len(pool), "pool_evicted": pool.evicted}

    # -- 1. streams ------------------------------------------------------------------------
    def stream_prompts(self, n: int) -> list[list[int]]:
        return [self.chat_ids([{"role": "user", "content": p}]) for p in _stream_prompts(n)]

    def streams(self, n: int, mode: str, max_tokens: int) -> dict[str, float]:
        from .scheduler import SequenceRequest

        prompts = self.stream_prompts(n)
        gaps: list[float] = []
        firsts: list[float] = []
        lasts: list[list] = []
        lock = threading.Lock()
        sched = self.scheduler(max_seqs=max(8, n))
        try:
            handles = []
            start = time.perf_counter()
            for ids in prompts:
                last = [None]

                def on_token(tok, piece, last=last):
                    now = time.perf_counter()
                    with lock:
                        if last[0] is not None:
                            gaps.append(now - last[0])
                        else:
                            firsts.append(now)
                            last.append(now)
                    last[0] = now
                lasts.append(last)

                handles.append(sched.submit_request(SequenceRequest(ids, max_tokens, options=self.options(mode), on_token=on_token)))
            for h in handles:
                h.wait()
            wall = time.perf_counter() - start
        finally:
            sched.close()
        tokens = sum(len(h.result.tokens) for h in handles)
        # time per output token of each stream after its first: (last - first) / (n - 1)
        tpot = [(last[0] - last[1]) / (len(h.result.tokens) - 1) for last, h in zip(lasts, handles)
                if len(last) > 1 and len(h.result.tokens) > 1]
        return {"tok_s": tokens / wall, "ttft_p50_ms": 1000 * (_percentile(firsts, 0.5) - start), "itl_p50_ms": 1000 * _percentile(gaps, 0.5), "itl_p99_ms": 1000 * _percentile(gaps, 0.99),
                "tpot_ms": 1000 * statistics.mean(tpot) if tpot else float("nan"),
                "tokens": tokens}

    def solo(self, mode: str, max_tokens: int) -> dict[str, float]:
        """The reference of the streams section: ``generate`` (what ``tsspec generate`` runs) on
        the first stream's prompt, timed as a stream is (submission to last token)."""
        from tsspec import generate

        ids = self.stream_prompts(1)[0]
        start = time.perf_counter()
        result = generate(self.target, ids, self.options(mode), max_tokens=max_tokens, registry=self.registry,
                          on_token=lambda tok, piece: None)
        return {"tok_s": len(result.tokens) / (time.perf_counter() - start), "tokens": len(result.tokens)}

    # -- 2. multi-turn chat ----------------------------------------------------------------
    def conversation(self, mode: str, max_tokens: int) -> list[dict[str, Any]]:
        from .scheduler import SequenceRequest

        code = inspect.getsource(textwrap.indent)
        messages: list[dict[str, str]] = []
        turns = []
        sched = self.scheduler(max_seqs=1)
        try:
            for i, turn in enumerate(TURNS):
                messages.append({"role": "user", "content": turn.format(code=code)})
                request = SequenceRequest(self.chat_ids(messages), max_tokens, options=self.options(mode),
                                          arm_after_reuse=False if mode == "refuse-all" else None)
                handle = sched.submit_request(request)
                handle.wait()
                result = handle.result
                messages.append({"role": "assistant", "content": result.text})
                stats = result.stats
                turns.append({"turn": i + 1, "tok_s": stats.tokens_per_second, "tokens": result.tokens,
                              "reused": stats.prefix_reused, "armed": stats.armed_after_reuse,
                              "accepted": stats.accepted_tokens, "drafted": stats.draft_tokens})
        finally:
            sched.close()
        return turns

    # -- 3. memory -------------------------------------------------------------------------
    def memory(self, requests: int, max_tokens: int) -> dict[str, float]:
        from .scheduler import SequenceRequest

        prompts = [self.chat_ids([{"role": "user", "content": f"Say a word about the number {i}."}]) for i in range(16)]
        sched = self.scheduler()
        try:
            def wave(start: int, count: int) -> int:
                handles, cancelled = [], 0
                for i in range(start, start + count):
                    holder: dict[str, Any] = {}
                    cancel = i % 3 == 2

                    def on_token(tok, piece, holder=holder, cancel=cancel):
                        if cancel:
                            sched.cancel(holder["h"])

                    holder["h"] = sched.submit_request(SequenceRequest(
                        prompts[i % len(prompts)], max_tokens, options=self.options("spec" if i % 2 else "plain"),
                        on_token=on_token))
                    handles.append(holder["h"])
                for h in handles:
                    h.wait()
                    cancelled += h.state == "cancelled"
                return cancelled

            wave(0, 8)  # warm-up: allocations, the speculator's first use
            gc.collect()
            before = _rss_mb()
            cancelled = 0
            for start in range(0, requests, 8):
                cancelled += wave(start, min(8, requests - start))
            gc.collect()
            after = _rss_mb()
            snap = sched.snapshot()
        finally:
            sched.close()
        return {"requests": requests, "cancelled": cancelled, "rss_before_mb": before, "rss_after_mb": after,
                "kv_blocks_in_use_after": snap["kv_blocks_in_use"], "kv_blocks_reserved_after": snap["kv_blocks_reserved"]}


_PEER = r"""
import json, sys, time
from llama_cpp import Llama
path, threads, max_tokens, prompts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.stdin.read())
llm = Llama(model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False, seed=0)
llm.create_completion(prompts[0][:8], max_tokens=2, temperature=0.0)
out = []
for n in sorted(json.loads(sys.argv[4])):
    start, tokens = time.perf_counter(), 0
    for ids in prompts[:n]:  # one slot: the requests of a level one after another
        llm.reset()
        reply = llm.create_completion(ids, max_tokens=max_tokens, temperature=0.0, top_k=1, repeat_penalty=1.0)
        tokens += reply["usage"]["completion_tokens"]
    out.append({"streams": n, "tok_s": tokens / (time.perf_counter() - start), "tokens": tokens})
print(json.dumps({"version": __import__("llama_cpp").__version__, "levels": out}))
"""


def peer_streams(model_path: str, prompts: list[list[int]], levels, max_tokens: int, threads: int) -> dict[str, Any]:
    """llama.cpp through llama-cpp-python in its own process, one slot (its server decodes one
    request at a time): aggregate tok/s of ``n`` requests served one after another, a lower bound
    for llama.cpp's multi-slot server. ``{"error": ...}`` when it cannot run here."""
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", _PEER, model_path, str(threads), str(max_tokens), json.dumps(list(levels))],
                              input=json.dumps(prompts), capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        return {"error": "the peer ran past an hour"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def stream_peer(target, bench, max_tokens: int) -> dict[str, Any]:
    """llama.cpp at the streams section's levels: its multi-slot ``llama-server --parallel N``
    when the cache holds a build for this CPU (``python -m tsspec_serve.peer_server``), else
    llama-cpp-python with one slot, labelled a lower bound, and the server "not built"."""
    from .peer_server import cached_binary, serve_levels

    path = str(getattr(target, "path", "") or "")
    if not path:
        return {"error": "the model has no file"}
    prompts = bench.stream_prompts(max(STREAM_LEVELS))
    threads = os.cpu_count() or 1
    binary = cached_binary()
    if binary is not None:
        return {"kind": "llama-server", **serve_levels(binary, path, prompts, STREAM_LEVELS, max_tokens, threads)}
    result = peer_streams(path, prompts, STREAM_LEVELS, max_tokens, threads)
    return {"kind": "one-slot", "server": "not built", **result}


class _LoopbackServer:
    """``create_app(engine)`` under uvicorn in a thread, on a free loopback port."""

    def __init__(self, engine):
        import socket

        import uvicorn

        from .api import create_app

        self.engine = engine.start()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the loopback server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.engine.close()
        self.sock.close()


def _md_per_stream(rows) -> list[str]:
    out = ["| mode | server tok/s | generate tok/s | server / generate (median of pairs) | pair range | pairs |",
           "|---|---:|---:|---:|---|---:|"]
    for mode, r in rows.items():
        out.append(f"| {mode} | {r['server']:.1f} | {r['generate']:.1f} | {r['ratio']:.3f}x | "
                   f"{r['ratio_low']:.2f}-{r['ratio_high']:.2f} | {len(r['pairs'])} |")
    return out


def _md_trace(tr) -> list[str]:
    m, p = tr["measured"], tr["prose"]
    out = ["| requests | mode | decode tok/s | tokens | / ngram (median of pairs) | pair range |",
           "|---|---|---:|---:|---:|---|",
           f"| trace, measured half ({m['requests']}) | ngram (per request) | {m['tok_s']['ngram']:.1f} | {m['tokens']['ngram']} | | |",
           f"| | ngram-pool (warmed) | {m['tok_s']['pool']:.1f} | {m['tokens']['pool']} | {m['ratio']['pool']:.3f}x | "
           f"{m['low']['pool']:.2f}-{m['high']['pool']:.2f} |",
           f"| prose control ({p['requests']}) | ngram | {p['tok_s']['ngram']:.1f} | {p['tokens']['ngram']} | | |",
           f"| | ngram again (control row) | {p['tok_s']['ngram-again']:.1f} | {p['tokens']['ngram-again']} | "
           f"{p['ratio']['ngram-again']:.3f}x | {p['low']['ngram-again']:.2f}-{p['high']['ngram-again']:.2f} |",
           f"| | ngram-pool (warmed) | {p['tok_s']['pool']:.1f} | {p['tokens']['pool']} | {p['ratio']['pool']:.3f}x | "
           f"{p['low']['pool']:.2f}-{p['high']['pool']:.2f} |",
           "", f"Pool after the run: {tr['pool_entries']} entries ({tr['pool_evicted']} evicted). Decode tok/s: tokens "
           "after each request's first over its decode time, summed over the requests of the row."]
    return out


def _md_streams(rows, peer=None, solo: float | None = None) -> list[str]:
    peer = peer or {}
    by_level = {p["streams"]: p["tok_s"] for p in peer.get("levels", [])}
    server = peer.get("kind") == "llama-server"
    theirs_label = "llama-server --parallel N tok/s" if server else "llama.cpp one slot tok/s (lower bound)"
    out = [f"| streams | plain tok/s | spec tok/s | spec / plain | plain / generate | {theirs_label} | plain ITL p50 / p99 ms | spec ITL p50 / p99 ms | plain / spec ms per token |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        theirs = f"{by_level[r['streams']]:.1f}" if r["streams"] in by_level else "-"
        versus = f"{r['plain']['tok_s'] / solo:.2f}x" if solo else "-"
        out.append(f"| {r['streams']} | {r['plain']['tok_s']:.1f} | {r['spec']['tok_s']:.1f} | {r['ratio']:.2f}x | {versus} | {theirs} | "
                   f"{r['plain']['itl_p50_ms']:.1f} / {r['plain']['itl_p99_ms']:.1f} | "
                   f"{r['spec']['itl_p50_ms']:.1f} / {r['spec']['itl_p99_ms']:.1f} | "
                   f"{r['plain']['tpot_ms']:.1f} / {r['spec']['tpot_ms']:.1f} |")
    if solo:
        out += ["", f"plain / generate: the level's aggregate over one stream of `generate` (what `tsspec generate` runs) on "
                f"the first prompt, timed the same way (prefill included): {solo:.1f} tok/s, the median of this run's."]
    if peer.get("error"):
        out += ["", f"llama.cpp peer: not run ({peer['error']})."]
    elif server:
        out += ["", f"llama.cpp peer: its own `llama-server --parallel N` (N slots, batched), built from llama-cpp-python "
                f"{peer_version()}'s llama.cpp source for this CPU, a fresh server per level, the level's requests at once."]
    elif by_level:
        out += ["", f"llama.cpp peer: llama-server not built (`python -m tsspec_serve.peer_server` builds it); shown instead: "
                f"llama-cpp-python {peer.get('version')} in its own process with one slot, the level's requests one after "
                "another: a single-slot lower bound for llama.cpp's multi-slot server."]
    return out


def peer_version() -> str:
    from .peer_server import VERSION

    return VERSION


def _md_turns(turns) -> list[str]:
    out = ["| turn | prefix reused | plain tok/s | refuse-all tok/s | armed tok/s | armed / refuse-all | armed / plain | armed accepted |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in turns:
        out.append(f"| {t['turn']} | {t['reused']} | {t['plain']:.1f} | {t['refuse-all']:.1f} | {t['armed']:.1f} | "
                   f"{t['armed'] / t['refuse-all']:.2f}x | {t['armed'] / t['plain']:.2f}x | {t['accepted']}/{t['drafted']} |")
    return out


def bench_serve(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="GGUF file (default: the embedded model).")] = None,
    reps: Annotated[int, typer.Option("--reps", min=1, help="Paired repetitions per measurement.")] = 2,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Tokens per stream.")] = 48,
    turn_tokens: Annotated[int, typer.Option("--turn-tokens", min=1, help="Tokens per chat turn.")] = 120,
    requests: Annotated[int, typer.Option("--requests", min=8, help="Requests of the memory check.")] = 1000,
    kv_cache_mb: Annotated[float, typer.Option("--kv-cache-mb")] = 256.0,
    only: Annotated[Optional[str], typer.Option("--only", help="streams, chat, memory, per-stream or trace (default: all).")] = None,
    trace_conversations: Annotated[int, typer.Option("--trace-conversations", min=2, help="Conversations of the agent trace (24: the defined trace; fewer: a shorter run).")] = 24,
    trace_seed: Annotated[int, typer.Option("--trace-seed", help="The agent trace's seed.")] = 2026,
    prose: Annotated[int, typer.Option("--prose", min=1, help="Prose requests of the trace section's control.")] = 6,
    peer: Annotated[bool, typer.Option("--peer/--no-peer", help="Run llama.cpp (llama-cpp-python, one slot) at the streams section's levels.")] = True,
    trace_requests: Annotated[Optional[int], typer.Option("--trace-requests", min=2, help="Run only the first N requests of the trace (a subset, for a short run).")] = None,
    pairs: Annotated[int, typer.Option("--pairs", min=2, help="Pairs of the per-stream section.")] = 6,
    markdown: Annotated[Optional[str], typer.Option("--markdown", help="Write the tables to this file (after each section).")] = None,
    json_path: Annotated[Optional[str], typer.Option("--json", help="Write the figures as JSON.")] = None,
) -> None:
    """Serving figures: tok/s and inter-token latency at 1-8 streams, the multi-turn chat with prefix reuse, RSS over many requests."""
    from tsspec.cli.generate_cmd import load_target
    from tsspec.cli.state import STATE
    from tsspec.errors import OptionsError
    from tsspec import SpeculationOptions

    if only not in (None, "streams", "chat", "memory", "per-stream", "trace"):
        raise OptionsError(f"--only must be streams, chat, memory, per-stream or trace, got {only!r}")
    target = load_target(model, "cpu", None, SpeculationOptions())
    bench = _Bench(target, STATE.catalog.speculators, kv_cache_mb)
    report: dict[str, Any] = {"machine_note": "figures from one machine; see the command line and load"}
    lines = ["# Serving figures (`tsspec bench-serve`)", ""]

    def save() -> None:  # after every section: a run cut short keeps what it measured
        if markdown:
            with open(markdown, "w", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
        if json_path:
            with open(json_path, "w", encoding="utf-8") as handle:
                json.dump(report, handle, indent=1, default=str)

    if only in (None, "streams"):
        rows = []
        solo = []
        for rep in range(reps):  # the reference: one stream of generate, plain
            solo.append(bench.solo("plain", max_tokens)["tok_s"])
        report["streams_generate"] = {"tok_s": statistics.median(solo), "runs": solo}
        typer.echo(f"[streams] generate, one stream, plain: {statistics.median(solo):.1f} tok/s", err=True)
        for n in STREAM_LEVELS:
            runs = {"plain": [], "spec": []}
            for rep in range(reps):
                order = ("plain", "spec") if rep % 2 == 0 else ("spec", "plain")
                for mode in order:
                    runs[mode].append(bench.streams(n, mode, max_tokens))
            med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in runs[m][0]} for m in runs}
            row = {"streams": n, "plain": med["plain"], "spec": med["spec"], "ratio": med["spec"]["tok_s"] / med["plain"]["tok_s"]}
            rows.append(row)
            typer.echo(f"[streams {n}] plain {row['plain']['tok_s']:.1f} tok/s, spec {row['spec']['tok_s']:.1f} tok/s ({row['ratio']:.2f}x)", err=True)
        report["streams"] = rows
        peer = stream_peer(target, bench, max_tokens) if peer else {"error": "--no-peer"}
        report["streams_peer"] = peer
        typer.echo(f"[streams peer] {peer}", err=True)
        lines += [f"## Concurrent streams ({max_tokens} tokens each, n-gram vs plain, medians of {reps} paired runs)", "",
                  *_md_streams(rows, peer, report["streams_generate"]["tok_s"]), ""]
        save()

    if only in (None, "chat"):
        modes = ("armed", "refuse-all", "plain")
        runs = {m: [] for m in modes}
        for rep in range(reps):
            order = modes if rep % 2 == 0 else tuple(reversed(modes))
            for mode in order:
                runs[mode].append(bench.conversation(mode, turn_tokens))
        reference = runs["plain"][0]
        for mode in modes:
            for run in runs[mode]:
                for a, b in zip(run, reference):
                    if a["tokens"] != b["tokens"]:
                        raise RuntimeError(f"turn {a['turn']} of mode {mode} differs from plain: not lossless")
        turns = []
        for i in range(len(TURNS)):
            row = {"turn": i + 1, "reused": runs["armed"][0][i]["reused"],
                   "accepted": runs["armed"][0][i]["accepted"], "drafted": runs["armed"][0][i]["drafted"]}
            for mode in modes:
                row[mode] = statistics.median(run[i]["tok_s"] for run in runs[mode])
            turns.append(row)
            typer.echo(f"[chat turn {i + 1}] reused {row['reused']}: plain {row['plain']:.1f}, refuse-all {row['refuse-all']:.1f}, armed {row['armed']:.1f} tok/s", err=True)
        report["chat"] = turns
        lines += [f"## Multi-turn chat with prefix reuse (4 turns, {turn_tokens} tokens a turn, medians of {reps} paired runs; outputs identical)", "",
                  *_md_turns(turns), ""]
        save()

    if only in (None, "memory"):
        mem = bench.memory(requests, 4)
        report["memory"] = mem
        typer.echo(f"[memory] RSS {mem['rss_before_mb']:.1f} -> {mem['rss_after_mb']:.1f} MiB over {requests} requests ({mem['cancelled']} cancelled)", err=True)
        lines += ["## Memory over many requests", "",
                  f"RSS {mem['rss_before_mb']:.1f} MiB before and {mem['rss_after_mb']:.1f} MiB after {mem['requests']} requests "
                  f"(4 tokens each, waves of 8, {mem['cancelled']} cancelled after their first token); KV blocks held afterwards: "
                  f"{mem['kv_blocks_in_use_after']}, reserved: {mem['kv_blocks_reserved_after']}.", ""]
        save()

    if only in (None, "per-stream"):
        rows = {}
        for mode in ("plain", "spec"):
            rows["plain" if mode == "plain" else "ngram"] = r = bench.per_stream(mode, pairs, max_tokens)
            typer.echo(f"[per stream {mode}] server {r['server']:.1f} tok/s, generate {r['generate']:.1f} tok/s, "
                       f"median pair ratio {r['ratio']:.3f}x ({r['ratio_low']:.2f}-{r['ratio_high']:.2f})", err=True)
        report["per_stream"] = rows
        lines += [f"## One stream through the HTTP server vs `generate` ({max_tokens} tokens, paired and alternating, "
                  "a different prompt each pair)", "", *_md_per_stream(rows), ""]
        save()

    if only in (None, "trace"):
        tr = bench.trace(max_tokens, trace_conversations, trace_seed, prose, trace_requests)
        report["trace"] = tr
        m, p = tr["measured"], tr["prose"]
        typer.echo(f"[trace] {tr['requests']} requests, {tr['warm']} warm; measured: pool {m['tok_s']['pool']:.1f} vs ngram "
                   f"{m['tok_s']['ngram']:.1f} tok/s, median pair {m['ratio']['pool']:.3f}x; prose: pool/ngram "
                   f"{p['ratio']['pool']:.3f}x, control ngram/ngram {p['ratio']['ngram-again']:.3f}x "
                   f"({p['low']['ngram-again']:.2f}-{p['high']['ngram-again']:.2f})", err=True)
        cut = f"the first {tr['requests']} of its requests" if tr["limit"] else f"{tr['requests']} requests"
        lines += [f"## Cross-request draft memory: the agent trace (seed {tr['seed']}, {tr['conversations']} conversations, "
                  f"{cut}; the first {tr['warm']} warm the pool, the rest measured, {max_tokens} tokens each)", "",
                  *_md_trace(tr), ""]
        save()

    typer.echo("\n".join(lines))
    save()
