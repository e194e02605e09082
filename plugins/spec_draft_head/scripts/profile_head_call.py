"""Where one NextN head call's time goes: per-phase timers around the torch path of
``NextNFileHead`` (embed, inputs, qkv + rope, KV write, attention, finish, logits, the
full-vocabulary fill) and the speculator's gate, on the embedded model with its shipped MTP file.

The inputs are real: the prompt is run through the target once (its post-norm rows), then the
head is fed one 2-row call (a folded catch-up of one accepted token + the step) per position,
as the speculator does with ``--spec-draft 1`` and every draft accepted; each phase's median
over ``--calls`` calls is printed (microseconds), plus the whole call with and without the
native head (``TS_MTP_NATIVE``).

    python plugins/spec_draft_head/scripts/profile_head_call.py --calls 200
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def load():
    from tsspec_gguf.embedded import embedded_model_path
    from tsspec.runtime.loading import load_model
    from tsspec.runtime.options import SpeculationOptions

    target = load_model(embedded_model_path(), options=SpeculationOptions(spec_type="draft-head"))
    if target.draft_head is None:
        raise SystemExit("no drafter attached: is tsspec-drafters-smollm2 installed?")
    return target


def inputs(target, n_tokens: int):
    """(token ids [n], the target's post-norm rows [n, H]) of a prose prompt, from one forward."""
    text = "Photosynthesis is how plants make food from sunlight, water and air. " * 40
    ids = [int(i) for i in target.tokenizer.encode(text)][:n_tokens]
    _, hidden = target.spec_forward(ids, all_logits_rows=True, want_hidden=True)  # [n, H]
    return ids, hidden


def phases(head, ids, hidden, calls: int, rows: int) -> dict[str, list[float]]:
    """Run the torch path step by step with timers (same ops as NextNFileHead._advance)."""
    from tsspec_draft_head.confidence import top1_over_topk

    m = head.m
    out: dict[str, list[float]] = {}
    if hasattr(head, "use_native"):
        head.use_native(False)  # the phases are the torch path's

    def tick(name, t0):
        t1 = time.perf_counter_ns()
        out.setdefault(name, []).append((t1 - t0) / 1000.0)
        return t1

    head.reset()
    head.draft_catch_up(ids[:8], hidden[:8], 0)
    pos = 8
    torch.set_num_threads(1)
    with torch.inference_mode():
        for _ in range(calls):
            if pos + rows > len(ids):
                head.reset()
                head.draft_catch_up(ids[:8], hidden[:8], 0)
                pos = 8
            toks, h = ids[pos : pos + rows], hidden[pos - 1 : pos - 1 + rows]
            start = pos
            head._place(start)
            at = start - head.base
            head._ensure(at + rows)
            t = t_all = time.perf_counter_ns()
            emb = head.target.embed(toks).float()
            t = tick("embed", t)
            u = m.inputs(emb, h)
            t = tick("inputs (2 norms + eh_proj)", t)
            x = m._norm(u, m.attn_norm)
            cfg = m.cfg
            q = m._linear(x, "wq").unflatten(-1, (cfg.num_heads, cfg.head_dim))
            k = m._linear(x, "wk").unflatten(-1, (cfg.num_kv_heads, cfg.head_dim))
            v = m._linear(x, "wv").unflatten(-1, (cfg.num_kv_heads, cfg.head_dim))
            t = tick("qkv (norm + 3 matmuls)", t)
            from tsspec_draft_head.nextn_model import apply_rope

            cos, sin = head._rope(start, rows)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            t = tick("rope", t)
            head._k[at : at + rows] = k
            head._v[at : at + rows] = v
            t = tick("kv write", t)
            keys, values = head._k[: at + rows], head._v[: at + rows]
            mask = torch.arange(at + rows)[None, :] <= (at + torch.arange(rows))[:, None] if rows > 1 else None
            attn = m.attend(q.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), mask)[0]
            t = tick("attention", t)
            head.end = start + rows
            o = m.finish(u, attn)
            t = tick("finish (wo, norm, ffn, head_norm)", t)
            small = m.logits(o[-1])
            t = tick("logits (draft head [K])", t)
            full = torch.full((head.vocab_size,), float("-inf"))
            full.index_copy_(0, m.draft_ids, small)
            t = tick("full-vocab fill", t)
            top1_over_topk(full)
            t = tick("gate on full vocab", t)
            top1_over_topk(small)
            t = tick("gate on [K]", t)
            out.setdefault("total (torch path, timers in)", []).append((t - t_all) / 1000.0)
            pos += rows - 1
    return out


def whole_calls(head, ids, hidden, calls: int, rows: int, flush: torch.Tensor | None = None):
    """Microseconds of ``draft_catch_up_and_step`` + the gate (what a proposal pays); with
    ``flush``, that buffer is read between calls (untimed) so the head's weights start cold,
    as they do in generation after a target step has streamed the model's weights. Returns
    (wall us, CPU us of the calling thread) per call."""
    from tsspec_draft_head.confidence import top1_over_topk

    head.reset()
    head.draft_catch_up(ids[:8], hidden[:8], 0)
    pos, times, cpu = 8, [], []
    for _ in range(calls):
        if pos + rows > len(ids):
            head.reset()
            head.draft_catch_up(ids[:8], hidden[:8], 0)
            pos = 8
        if flush is not None:
            flush.sum()
        compact = getattr(head, "draft_vocab_ids", None) is not None
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        logits, _ = head.draft_catch_up_and_step(ids[pos : pos + rows], hidden[pos - 1 : pos - 1 + rows], pos,
                                                 **({"compact": True} if compact and head.native else {}))
        top1_over_topk(logits)
        times.append((time.perf_counter_ns() - t0) / 1000.0)
        cpu.append((time.thread_time_ns() - c0) / 1000.0)
        pos += rows - 1
    return times, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rows", type=int, default=2, help="rows per head call (2: one catch-up row + the step)")
    ap.add_argument("--tokens", type=int, default=400, help="prompt tokens run through the target first")
    ap.add_argument("--cold-mb", type=int, default=0,
                    help="read a buffer of this many MiB between timed calls (weights start cold, as in generation)")
    ap.add_argument("--threads", type=int, nargs="*", default=[0],
                    help="kernel threads of the native head to try (0: torch's thread count)")
    args = ap.parse_args()
    target = load()
    ids, hidden = inputs(target, args.tokens)
    head = target.draft_head
    threads_before = torch.get_num_threads()
    torch.manual_seed(0)
    res = phases(head, ids, hidden, args.calls, args.rows)
    print(f"phases of one {args.rows}-row head call (torch path, one thread, warm caches), "
          f"median us over {args.calls} calls:")
    for name, values in res.items():
        print(f"  {name:<36} {statistics.median(values):8.1f}")
    flush = torch.ones(args.cold_mb << 18) if args.cold_mb else None  # float32: 4 bytes each
    torch.set_num_threads(threads_before)
    runs = [("torch (full-vocabulary logits and gate)", False, 0)]
    runs += [(f"native (compact gate), kernel threads {t or torch.get_num_threads()}", True, t) for t in args.threads]
    for label, native, threads in runs:
        if native and not hasattr(head, "use_native"):
            continue
        if hasattr(head, "use_native"):
            head.use_native(native)
        if native:
            head._native.threads = threads or None
        times, cpu = whole_calls(head, ids, hidden, args.calls, args.rows, flush)
        print(f"whole call + gate, {label}: median {statistics.median(times):.1f} us wall, "
              f"{statistics.median(cpu):.1f} us CPU of the calling thread")


if __name__ == "__main__":
    main()
