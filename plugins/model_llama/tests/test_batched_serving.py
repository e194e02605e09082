"""The scheduler on a llama's paged KV: concurrent sequences, each equal to its solo plain run;
cancellation frees everything; a prefix from the cache is adopted and speculation still arms."""

from __future__ import annotations

import threading

import pytest

from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.registry import SpeculatorRegistry
from tsspec.runtime.sampling import SamplingParams
from tsspec_serve.scheduler import CANCELLED, FINISHED, Scheduler, SequenceRequest
from tsspec.testing import OracleSpeculator, RandomSpeculator, plain_tokens

PLAIN = SpeculationOptions(enabled=False)


@pytest.fixture
def tiny_path(tiny):
    from gguf import GGMLQuantizationType as T

    from tsspec_gguf import native

    if not native.available():
        pytest.skip("the block kernels were not built")
    return tiny(quantize={"*": T.Q8_0})[2]


def _registry(target, expected):
    """'random' drafts noise; 'oracle' drafts each prompt's plain continuation (it lands)."""
    registry = SpeculatorRegistry()
    registry.register("random", lambda t, o: RandomSpeculator(300, max_draft_tokens=4, seed=5), requires_draft_head=False)

    def oracle(t, o):
        return OracleSpeculator(expected[0], vocab_size=300, max_draft_tokens=5, corrupt=0.3, seed=1)

    registry.register("oracle", oracle, requires_draft_head=False)
    return registry


def _solo(path, prompt, max_tokens, sampling):
    from tsspec_model_llama import load_llama

    return plain_tokens(load_llama(path), prompt, max_tokens, sampling)


def test_concurrent_sequences_each_equal_their_solo_plain_run(tiny_path):
    from tsspec_model_llama import load_llama

    target = load_llama(tiny_path)
    prompts = [[5, 9, 33, 2, 7, 100, 12, 8], [250, 3, 3, 3], [17] * 21, [5, 9, 33, 2, 7, 100, 12, 8, 40, 41], [1, 2], [9] * 40]
    samplings = [None, SamplingParams(temperature=0.9, top_k=40, seed=11), None, SamplingParams(temperature=0.7, seed=3), None, None]
    kinds = ["plain", "random", "plain", "random", "random", "plain"]
    max_tokens = 14
    expected = [_solo(tiny_path, p, max_tokens, s) for p, s in zip(prompts, samplings)]
    registry = _registry(target, None)
    with Scheduler(target, kv_cache_mb=1, block_size=4, max_seqs=3, registry=registry, batch_wait_ms=200) as sched:
        handles = [
            sched.submit_request(SequenceRequest(
                p, max_tokens, sampling=s or SamplingParams(),
                options=PLAIN if k == "plain" else SpeculationOptions(spec_type=k, adaptive=False),
            ))
            for p, s, k in zip(prompts, samplings, kinds)
        ]
        for h in handles:
            assert h.wait(120)
        assert [h.state for h in handles] == [FINISHED] * len(prompts)
        for i, h in enumerate(handles):
            assert h.result.tokens == expected[i], f"sequence {i} differs from its solo run"
        assert any(h.result.stats.verify_steps for h in handles)  # speculation ran in batches
        snap = sched.snapshot()
        assert snap["steps"] < sum(len(e) for e in expected)  # rows really shared forwards
        assert snap["running"] == 0 and snap["kv_blocks_in_use"] == 0 and snap["kv_blocks_reserved"] == 0
        assert snap["prefix_hit_tokens"] > 0  # prompt 3 starts with prompt 0's first blocks


def test_cancel_at_any_step_frees_blocks(tiny_path):
    from tsspec_model_llama import load_llama

    target = load_llama(tiny_path)
    with Scheduler(target, kv_cache_mb=1, block_size=4, max_seqs=2) as sched:
        seen = []
        holder = {}

        def on_token(tok, piece):
            seen.append(tok)
            if len(seen) == 3:
                sched.cancel(holder["h"])

        holder["h"] = sched.submit_request(SequenceRequest([3, 4, 5, 6, 7], 200, on_token=on_token))
        other = sched.submit_request(SequenceRequest([8, 9], 6))
        queued = sched.submit_request(SequenceRequest([10, 11], 6))
        sched.cancel(queued)  # cancelled while still waiting (two running already)
        assert holder["h"].wait(60) and other.wait(60) and queued.wait(60)
        assert holder["h"].state == CANCELLED and 3 <= len(seen) <= 4
        assert other.state == FINISHED and queued.state == CANCELLED
        snap = sched.snapshot()
        assert snap["kv_blocks_in_use"] == 0 and snap["kv_blocks_reserved"] == 0
        assert snap["finished"] == {"finished": 1, "cancelled": 2, "failed": 0}


def test_prefix_reuse_arms_speculation_unless_refused(tiny_path):
    from tsspec_model_llama import load_llama

    target = load_llama(tiny_path)
    first = [7, 1, 9, 4, 4, 2, 8, 6, 3, 5, 11, 12]
    answer = _solo(tiny_path, first, 10, None)
    follow = first + answer + [13, 14, 15]
    expected_tail = _solo(tiny_path, follow, 12, None)
    box = [follow + expected_tail]
    registry = _registry(target, box)
    with Scheduler(target, kv_cache_mb=1, block_size=4, max_seqs=2, registry=registry) as sched:
        h = sched.submit_request(SequenceRequest(first, 10))
        assert h.wait(60) and h.result.tokens == answer
        results = {}
        for policy in (None, False):
            h = sched.submit_request(SequenceRequest(
                follow, 12, options=SpeculationOptions(spec_type="oracle", adaptive=False), arm_after_reuse=policy
            ))
            assert h.wait(60) and h.state == FINISHED
            results[policy] = h
        armed, refused = results[None].result, results[False].result
        assert armed.tokens == refused.tokens == expected_tail
        assert results[None].reused_tokens >= 16 and armed.stats.prefix_reused == results[None].reused_tokens
        assert armed.stats.armed_after_reuse and armed.stats.accepted_tokens > 0
        assert not refused.stats.armed_after_reuse and refused.stats.draft_tokens == 0
        assert sched.snapshot()["arming"] == {"armed": 1, "refused": 1}
        assert "armed=yes" in armed.stats.one_line()


def test_submit_errors(tiny_path):
    from tsspec.errors import GenerationError
    from tsspec_model_llama import load_llama

    target = load_llama(tiny_path)
    with pytest.raises(GenerationError, match="give it more"):
        Scheduler(target, kv_cache_mb=0.0001)
    with Scheduler(target, kv_cache_mb=0.05, block_size=4) as sched:
        with pytest.raises(GenerationError, match="KV blocks"):
            sched.submit_request(SequenceRequest([1, 2, 3], 400))
        with pytest.raises(GenerationError, match="context"):
            sched.submit_request(SequenceRequest([1] * 600, 4))
        with pytest.raises(GenerationError, match="empty"):
            sched.submit_request(SequenceRequest([], 4))
    dense = load_llama(tiny_path, {"dtype": "float32"})
    with Scheduler(dense, kv_cache_mb=1) as serial:  # no paged path here: one at a time
        assert "block-kernel" in serial.serial and serial.max_seqs == 1
        h = serial.submit_request(SequenceRequest([4, 5, 6], 5))
        assert h.wait(60) and h.result.tokens == plain_tokens(dense, [4, 5, 6], 5)


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_long_prompts_served_equal_their_solo_run(tiny, dtype):
    """Prompts of 100-1,000 tokens: the scheduler prefills them in chunks beside other work and
    each answer equals the prompt decoded alone (one long prefill call), greedy and seeded."""
    from gguf import GGMLQuantizationType as T

    from tsspec_gguf import native
    from tsspec_model_llama import load_llama

    if not native.available():
        pytest.skip("the block kernels were not built")
    path = tiny(quantize={"*": T.Q8_0}, max_position_embeddings=1100)[2]
    options = {"dtype": dtype} if dtype else None
    prompts = [[(7 * i + 3) % 300 for i in range(100)], [(i * i) % 297 + 1 for i in range(400)],
               [(13 * i + i // 7) % 299 for i in range(1000)]]
    samplings = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.95, seed=2), SamplingParams()]
    max_tokens = 6
    expected = [plain_tokens(load_llama(path, options), p, max_tokens, s) for p, s in zip(prompts, samplings)]
    target = load_llama(path, options)
    with Scheduler(target, kv_cache_mb=8, block_size=16, max_seqs=3, registry=_registry(target, None),
                   batch_wait_ms=50) as sched:
        handles = [sched.submit_request(SequenceRequest(p, max_tokens, sampling=s, options=PLAIN))
                   for p, s in zip(prompts, samplings)]
        for h in handles:
            assert h.wait(300)
        for i, h in enumerate(handles):
            assert h.state == FINISHED and h.result.tokens == expected[i], f"prompt {i} differs from its solo run"


def test_generate_batched_without_a_server_equals_solo_runs(tiny_path):
    """The core's batched driver alone (no scheduler, no prefix cache): what bench and training
    use to batch; each sequence equals its solo run, plain and speculative, greedy and seeded."""
    from tsspec.runtime.batching import generate_batched
    from tsspec_model_llama import load_llama

    target = load_llama(tiny_path)
    prompts = [[5, 9, 33, 2, 7], [250, 3, 3, 3, 3, 3], [17] * 9]
    samplings = [None, SamplingParams(temperature=0.9, top_k=40, seed=11), None]
    expected = [_solo(tiny_path, p, 10, s) for p, s in zip(prompts, samplings)]
    registry = _registry(target, None)
    for options in (PLAIN, SpeculationOptions(spec_type="random", adaptive=False)):
        results = generate_batched(target, prompts, options, max_tokens=10, sampling=samplings, registry=registry,
                                   kv_cache_mb=1, block_size=4, batch_wait_ms=200)
        assert [r.tokens for r in results] == expected
