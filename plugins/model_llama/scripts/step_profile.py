"""Where a decode step's wall time goes on the kernels' thread pool: per kind of pool region (the
blocks' QKV, attention, O, gate/up and down, the LM head's gemm), the regions a step runs, their
wall time, the time the caller and the workers spent inside chunks, how long the caller waited
for chunks a worker still held (and how often it gave up its core while waiting), and how late
the first worker joined; the blocks' time outside every region (norms, RoPE, KV writes, SiLU,
run by the caller alone); and what bringing every thread into a region and back out costs (the handshake).

After a prefill of ``--context`` tokens, ``--steps`` one-row forwards (each rewound to one new
token) run with the statistics on; all figures are per step, in milliseconds unless a count.

    python plugins/model_llama/scripts/step_profile.py [--context 500] [--steps 50] [--threads 2]
        [--dtype float32-blocks] [--switch guided --rounds 9] [--rows 1,2,3,4,5,6,7,8,9]

``--rows LIST [--python-step]`` profiles forwards of each of those row counts (a verify: every row's logits) and
prints one line per count (``--off NAME+NAME``: with those kernel switches off): the forward's wall time, the block gemms by kind (wall time of their
pool regions), attention, the blocks' ops outside regions, the LM head's gemm, and the rest
(Python and torch around the native calls: embedding, final norm, logits' copies).

``--switch NAME`` instead pairs the kernels' ``set_NAME(False)`` (side A) against ``set_NAME(True)``
(side B, the default) over ``--rounds`` rounds (sides alternate, order swapped every round):
median step wall time, the caller's waits and the workers' share of the chunks, per side.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tsspec_gguf import native
from tsspec_gguf.embedded import embedded_model_path

KINDS = ("qkv", "attention", "o", "gate_up", "down", "gemm")  # "gemm": the LM head's call from Python


def handshake(kernels, threads: int, regions: int = 20000) -> str:
    """Percentiles of the wall time of a region whose chunks wait until every thread came."""
    kernels.probe_handshake(200, threads)  # start the workers
    ns = sorted(kernels.probe_handshake(regions, threads))
    at = {p: ns[min(len(ns) - 1, len(ns) * p // 100)] / 1e3 for p in (10, 50, 90, 99)}
    late = sum(v >= 1_000_000 for v in ns) / len(ns)
    return (f"min {ns[0] / 1e3:.2f}, p10 {at[10]:.2f}, median {at[50]:.2f}, p90 {at[90]:.2f}, p99 {at[99]:.2f} us; "
            f"{late:.1%} of {regions} regions waited >= 1 ms for a worker")


def main() -> int:
    from tsspec_model_llama import load_llama

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32-blocks")
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--switch", default=None, help="pair set_SWITCH(False) against set_SWITCH(True)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--rows", default=None, help="comma-separated row counts: one line each")
    ap.add_argument("--off", default=None, help="NAME+NAME: run with the kernels' set_NAME(False)")
    ap.add_argument("--python-step", action="store_true",
                    help="with --rows: pair the step in one native call against the Python path around layers_forward")
    args = ap.parse_args()
    kernels = native.kernels()
    if kernels is None or not hasattr(kernels, "pool_stats"):
        raise SystemExit("step_profile: these kernels keep no pool statistics")
    torch.set_num_threads(args.threads)
    for name in args.off.split("+") if args.off else ():
        getattr(kernels, f"set_{name}")(False)
    target = load_llama(embedded_model_path(), {"dtype": args.dtype})
    target.spec_forward([5] * args.context, all_logits_rows=False, want_hidden=False)
    for _ in range(5):  # warm up
        at = target.cache_seq_len
        target.spec_forward([5], all_logits_rows=True, want_hidden=False)
        target.spec_rewind_cache(at + 1)

    def steps(rows: int = 1) -> tuple[float, float, dict]:
        kernels.set_pool_stats(True)
        cpu0, start = time.process_time(), time.perf_counter()
        for _ in range(args.steps):
            at = target.cache_seq_len
            target.spec_forward([5] * rows, all_logits_rows=True, want_hidden=False)
            target.spec_rewind_cache(at + 1)
        wall = (time.perf_counter() - start) / args.steps * 1e3
        cpu = (time.process_time() - cpu0) / args.steps * 1e3
        stats = kernels.pool_stats()
        kernels.set_pool_stats(False)
        return wall, cpu, stats

    if args.switch:
        return paired(kernels, getattr(kernels, f"set_{args.switch}"), steps, args)
    if args.rows:
        return by_rows(steps, [int(r) for r in args.rows.split(",")], args, target)
    wall, cpu, stats = steps()
    n = args.steps

    def ms(kind: str, field: str) -> float:
        return stats.get(kind, {}).get(field, 0) / n / 1e6

    print(f"kernels: {native.info()}; threads {args.threads}; context {args.context}; {n} steps")
    print(f"step: wall {wall:.3f} ms, process CPU {cpu:.3f} ms (all threads)")
    columns = (  # (header, value per step)
        ("regions", lambda s: (s["regions"] + s["inline_regions"]) / n),
        ("inline", lambda s: s["inline_regions"] / n),
        ("chunks", lambda s: s["chunks"] / n),
        ("caller's", lambda s: s["caller_chunks"] / n),
        ("wall", lambda s: s["wall_ns"] / n / 1e6),
        ("caller_cpu", lambda s: s["caller_cpu_ns"] / n / 1e6),
        ("caller_in", lambda s: s["caller_busy_ns"] / n / 1e6),
        ("worker_in", lambda s: s["worker_busy_ns"] / n / 1e6),
        ("wait", lambda s: s["wait_ns"] / n / 1e6),
        ("waits", lambda s: s["waits"] / n),
        ("yielded", lambda s: s["long_waits"] / n),
        ("join_us", lambda s: s["join_ns"] / s["joined"] / 1e3 if s["joined"] else float("nan")),
    )
    print("kind      " + "".join(f"{h:>11}" for h, _ in columns))
    in_regions = 0.0
    for kind in KINDS:
        s = stats.get(kind)
        if not s:
            continue
        if kind != "gemm":  # the LM head's gemm runs outside layers_forward
            in_regions += ms(kind, "wall_ns")
        print(f"{kind:<10}" + "".join(f"{value(s):11.3f}" for _, value in columns))
    blocks = ms("blocks", "wall_ns")
    print(f"blocks: {blocks:.3f} ms in layers_forward, of which {blocks - in_regions:.3f} ms outside pool regions")
    outside = wall - blocks - ms("gemm", "wall_ns")
    print(f"outside layers_forward and the gemm calls (Python, embedding, final norm): {outside:.3f} ms")
    print(f"handshake (a region that brings every thread in and out): {handshake(kernels, args.threads)}")
    return 0


def by_rows(steps, counts: list[int], args, target) -> int:
    """One line per row count: where a forward of that many rows (every row's logits) spends its
    wall time, ms per forward (medians over ``--rounds`` rounds, the counts alternating). With
    ``--python-step`` each count runs twice in every round, with the step in one native call
    (``one``) and without it (``py``: ``native_step = False``), the two in alternating order, and
    a last column gives one / py for the forward and the rest (medians of the paired ratios)."""
    parts = ("qkv", "o", "gate_up", "down", "attention", "outside", "lm_head", "rest")
    variants = ("py", "one") if args.python_step else ("",)
    got: dict[tuple[int, str], list[dict[str, float]]] = {(r, v): [] for r in counts for v in variants}
    try:
        for rnd in range(args.rounds):
            for rows in counts if rnd % 2 == 0 else counts[::-1]:
                for variant in variants if rnd % 2 == 0 else variants[::-1]:
                    target.native_step = variant != "py"
                    wall, _, stats = steps(rows)
                    ms = lambda kind: stats.get(kind, {}).get("wall_ns", 0) / args.steps / 1e6  # noqa: E731
                    blocks = ms("blocks")
                    regions = sum(ms(k) for k in ("qkv", "attention", "o", "gate_up", "down"))
                    row = {k: ms(k) for k in ("qkv", "o", "gate_up", "down", "attention")}
                    row.update(wall=wall, outside=blocks - regions, lm_head=ms("gemm"), rest=wall - blocks - ms("gemm"))
                    got[rows, variant].append(row)
    finally:
        target.native_step = True
    print(f"kernels: {native.info()}; threads {args.threads}; context {args.context}; "
          f"{args.rounds} rounds of {args.steps} forwards; ms per forward (medians)")
    print("rows |  forward | " + " | ".join(f"{p:>9}" for p in parts) + " | gemms x one row")
    base = None
    for rows in counts:
        for variant in variants:
            med = {k: statistics.median(v[k] for v in got[rows, variant]) for k in ("wall", *parts)}
            gemms = sum(med[k] for k in ("qkv", "o", "gate_up", "down", "lm_head"))
            base = base or (med["wall"], gemms)
            line = (f"{rows:4d}{variant:>4} | {med['wall']:8.3f} | " + " | ".join(f"{med[p]:9.3f}" for p in parts)
                    + f" | {gemms / base[1]:.2f} (forward {med['wall'] / base[0]:.2f})")
            if variant == "one":
                pairs = list(zip(got[rows, "py"], got[rows, "one"]))
                line += "; one / py: forward {:.3f}, rest {:.3f}".format(
                    *(statistics.median(b[k] / a[k] for a, b in pairs) for k in ("wall", "rest")))
            print(line)
    return 0


def paired(kernels, switch, steps, args) -> int:
    """Side A: switch off, side B: on; per side and round the step wall time (ms), the caller's
    wait for chunks a worker held (ms a step) and the workers' share of the chunks."""
    sides = {"A": False, "B": True}
    got: dict[str, list[tuple[float, float, float]]] = {"A": [], "B": []}
    try:
        for r in range(args.rounds):
            for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                switch(sides[side])
                wall, _, stats = steps()
                kinds = [stats[k] for k in KINDS if k in stats]
                wait = sum(s["wait_ns"] for s in kinds) / args.steps / 1e6
                chunks = sum(s["chunks"] for s in kinds)
                share = 1 - sum(s["caller_chunks"] for s in kinds) / chunks if chunks else 0.0
                got[side].append((wall, wait, share))
    finally:
        switch(True)
    print(f"kernels: {native.info()}; threads {args.threads}; context {args.context}; "
          f"A = set_{args.switch}(False), B = set_{args.switch}(True); {args.rounds} rounds of {args.steps} steps")
    med = {side: [statistics.median(v[i] for v in got[side]) for i in range(3)] for side in got}
    for side in ("A", "B"):
        wall, wait, share = med[side]
        print(f"{side}: step {wall:.3f} ms, caller waiting {wait:.3f} ms a step, workers' share of chunks {share:.3f}")
    ratio = statistics.median(b[0] / a[0] for a, b in zip(got["A"], got["B"]))
    print(f"B/A step wall {med['B'][0] / med['A'][0]:.3f} (paired {ratio:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
