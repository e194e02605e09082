"""Aggregate throughput of 1 vs 2 tsspec replicas under a local Ray Serve, on this machine.

    python plugins/ray/scripts/bench_replicas.py [--requests 16] [--max-tokens 32] [--rounds 2]

One Ray instance; each run deploys the app with N replicas, warms it, then sends ``--requests``
distinct chat requests at once through the OpenAI client and counts completion tokens over the
wall time (aggregate tokens/s). Runs alternate 1, 2, 2, 1, 1, 2 ... (paired, both orders); the
control row compares the 1-replica runs with each other (the noise on this machine). Plain
decoding (no speculation) unless ``--spec``: this measures replication, not drafting. On a
machine with few cores the replicas share them: read the core count and load printed with it.
``--max-seqs`` caps the sequences a replica decodes together: with fewer slots than requests one
replica serves them in waves, which two replicas may not need (compare with it raised).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import time

QUESTIONS = [
    "Name a color and describe it.", "Explain what a prime number is.", "Describe a cat in two sentences.",
    "What is the capital of France, and why is it famous?", "Count from one to ten in words.",
    "Name three fruits and their colors.", "What day comes after Monday? Explain the week.",
    "Write a short greeting to a new neighbour.", "Why is the sky blue?", "Describe the water cycle.",
    "What is photosynthesis?", "Name an animal that lives in the sea.", "How do you boil an egg?",
    "What is a computer?", "Describe a sunny day.", "What is music?",
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _burst(base: str, model: str, prompts: list[str], max_tokens: int) -> tuple[int, float]:
    """(completion tokens, seconds) for ``prompts`` sent at once."""
    import openai

    client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)

    async def one(prompt: str) -> int:
        r = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                 max_tokens=max_tokens, temperature=0.0)
        return int(r.usage.completion_tokens)

    start = time.perf_counter()
    tokens = await asyncio.gather(*(one(p) for p in prompts))
    return sum(tokens), time.perf_counter() - start


def run(replicas: int, base: str, args) -> float:
    """Deploy with ``replicas``, warm up, measure one burst; aggregate tokens/s."""
    import openai
    from ray import serve

    from tsspec_ray.deployment import build_app

    spec = {} if args.spec else {"spec": False}
    app = build_app({"model": args.model, "replicas": replicas, "spec": spec,
                     "engine": {"max_seqs": args.max_seqs, "kv_cache_mb": 64.0}})
    serve.run(app, name="tsspec", route_prefix="/")
    model = openai.OpenAI(base_url=base, api_key="none").models.list().data[0].id
    prompts = [QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" ({i})") for i in range(args.requests)]
    asyncio.run(_burst(base, model, [f"Warm-up {i}: say hi." for i in range(2 * replicas)], 4))
    tokens, seconds = asyncio.run(_burst(base, model, prompts, args.max_tokens))
    serve.delete("tsspec")
    rate = tokens / seconds
    print(f"  {replicas} replica(s): {tokens} tokens in {seconds:.2f} s = {rate:.1f} tok/s", flush=True)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of 1- and 2-replica runs")
    parser.add_argument("--max-seqs", type=int, default=8)
    parser.add_argument("--model", default=None)
    parser.add_argument("--spec", action="store_true", help="the engine's default speculation instead of plain")
    args = parser.parse_args()

    import ray
    from ray import serve

    port = _port()
    base = f"http://127.0.0.1:{port}/v1"
    load = os.getloadavg()
    print(f"{os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.requests} "
          f"concurrent requests of {args.max_tokens} tokens, {'default speculation' if args.spec else 'plain'}, "
          f"--max-seqs {args.max_seqs} per replica",
          flush=True)
    for attempt in (1, 2):  # Ray gives its raylet 30 s to start, which a loaded machine can miss
        try:
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
            break
        except Exception as exc:
            ray.shutdown()
            if attempt == 2 or "timed out" not in str(exc):
                raise
    rates: dict[int, list[float]] = {1: [], 2: []}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for r in range(args.rounds):
            for n in ((1, 2) if r % 2 == 0 else (2, 1)):
                rates[n].append(run(n, base, args))
    finally:
        serve.shutdown()
        ray.shutdown()
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(f"median aggregate: 1 replica {one:.1f} tok/s, 2 replicas {two:.1f} tok/s: {two / one:.2f}x")
    if len(rates[1]) >= 2:
        print(f"control (1 replica vs 1 replica, runs 1 and 2): {rates[1][1] / rates[1][0]:.2f}x")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
