"""The scheduler on the hybrid's paged KV: concurrent qwen35 sequences (plain and speculative)
each equal their solo plain run; cancellation frees blocks and recurrent slots; a repeated
prompt is refused prefix reuse cleanly (stats say why) and still equals its solo run."""

from __future__ import annotations

import threading

from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.registry import SpeculatorRegistry
from tsspec.runtime.sampling import SamplingParams
from tsspec_serve.scheduler import CANCELLED, FINISHED, Scheduler, SequenceRequest
from tsspec.testing import RandomSpeculator, plain_tokens

PLAIN = SpeculationOptions(enabled=False)
RANDOM = SpeculationOptions(spec_type="random", adaptive=False)


def _registry():
    registry = SpeculatorRegistry()
    registry.register("random", lambda t, o: RandomSpeculator(96, max_draft_tokens=3, seed=5), requires_draft_head=False)
    return registry


def test_concurrent_qwen35_sequences_equal_their_solo_runs(make_target, sequence):
    prompts = [sequence[:12], sequence[40:45], sequence[:12]]
    samplings = [SamplingParams(), SamplingParams(temperature=0.9, top_k=20, seed=3), SamplingParams()]
    options = [PLAIN, RANDOM, RANDOM]
    max_tokens = 10
    expected = [plain_tokens(make_target(), p, max_tokens, s) for p, s in zip(prompts, samplings)]
    target = make_target()
    with Scheduler(target, kv_cache_mb=1, block_size=4, max_seqs=3, registry=_registry(), batch_wait_ms=200,
                   chunk_rows=4) as sched:
        assert sched.serial is None
        assert sched.chunk_rows >= len(prompts[0])  # prefills in one piece, as the solo run
        handles = [
            sched.submit_request(SequenceRequest(p, max_tokens, sampling=s, options=o))
            for p, s, o in zip(prompts, samplings, options)
        ]
        for h in handles:
            assert h.wait(120)
        assert [h.state for h in handles] == [FINISHED] * 3
        for i, h in enumerate(handles):
            assert h.result.tokens == expected[i], f"sequence {i} differs from its solo run"
        assert any(h.result.stats.verify_steps for h in handles)
        assert any("committed" in h.result.stats.rollback_modes for h in handles)
        snap = sched.snapshot()
        assert snap["steps"] < sum(len(e) + 1 for e in expected)  # sequences shared forwards
        assert snap["running"] == 0 and snap["kv_blocks_in_use"] == 0 and snap["kv_blocks_reserved"] == 0
        # the repeated prompt was not adopted: the hybrid refuses prefix reuse and says why
        assert snap["prefix_hit_tokens"] == 0 and snap["prefix_refusal"]
        assert all(h.reused_tokens == 0 for h in handles)
        assert sched.kv.live_sequences == 0  # every recurrent slot released


def test_cancel_mid_run_frees_blocks_and_slots(make_target, sequence):
    target = make_target()
    started = threading.Event()

    def on_token(token, piece):
        started.set()

    with Scheduler(target, kv_cache_mb=1, block_size=4, max_seqs=2, registry=_registry(), batch_wait_ms=50) as sched:
        long = sched.submit_request(SequenceRequest(sequence[:8], 200, options=RANDOM, on_token=on_token))
        assert started.wait(60)
        sched.cancel(long)
        assert long.wait(60) and long.state == CANCELLED
        after = sched.submit_request(SequenceRequest(sequence[50:54], 6))
        assert after.wait(60) and after.state == FINISHED
        assert after.result.tokens == plain_tokens(make_target(), sequence[50:54], 6)
        snap = sched.snapshot()
        assert snap["kv_blocks_in_use"] == 0 and snap["kv_blocks_reserved"] == 0
        assert sched.kv.live_sequences == 0
