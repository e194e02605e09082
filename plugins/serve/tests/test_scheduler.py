"""The server's scheduler without a paged path: one sequence at a time on the target's own cache.
(The scheduler on a real paged target: plugins/model_llama/tests/test_batched_serving.py.)"""

from __future__ import annotations

from tsspec_serve.scheduler import Scheduler


def test_a_target_without_a_paged_path_is_served_one_sequence_at_a_time():
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec_serve.scheduler import CANCELLED, FINISHED, SequenceRequest
    from tsspec.testing import RandomSpeculator, ToyTarget, plain_tokens

    target = ToyTarget(seed=3)
    registry = SpeculatorRegistry()
    registry.register("random", lambda t, o: RandomSpeculator(32, seed=2), requires_draft_head=False)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    expected = [plain_tokens(ToyTarget(seed=3), p, 12) for p in prompts]
    with Scheduler(target, registry=registry) as sched:
        assert sched.serial and sched.max_seqs == 1
        handles = [sched.submit_request(SequenceRequest(p, 12, options=SpeculationOptions(spec_type="random", adaptive=False)))
                   for p in prompts]
        holder = {}
        seen = []

        def on_token(tok, piece):
            seen.append(tok)
            if len(seen) == 2:
                sched.cancel(holder["h"])

        holder["h"] = sched.submit_request(SequenceRequest([3, 3, 3], 50, on_token=on_token))
        for h in handles + [holder["h"]]:
            assert h.wait(60)
        assert [h.result.tokens for h in handles] == expected
        assert [h.state for h in handles] == [FINISHED] * 3 and holder["h"].state == CANCELLED
        snap = sched.snapshot()
        assert snap["kv_blocks_total"] == 0 and snap["finished"][CANCELLED] == 1 and snap["running"] == 0
