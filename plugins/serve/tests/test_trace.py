"""The agent trace is what its definition says (seeded, >= 200 requests from >= 20 conversations,
a system prompt and tool schema of >= 300 tokens repeated in every request, 5-15 turns with tool
calls and results, some repeated), and the bench's trace section runs on a small cut of it."""

from __future__ import annotations

import collections

import pytest

from tsspec_serve.trace import agent_trace, prose_prompts, system_prompt


def test_the_trace_meets_its_definition(embedded_target):
    tokenizer = embedded_target.tokenizer
    trace = agent_trace()
    assert trace == agent_trace() and trace != agent_trace(seed=1)  # a function of its seed
    assert len(trace) >= 200 and len({r.conversation for r in trace}) >= 20
    turns = collections.Counter(r.conversation for r in trace)
    assert min(turns.values()) >= 5 and max(turns.values()) <= 15
    for request in trace:
        system = request.messages[0]
        assert system == {"role": "system", "content": system_prompt(request.agent)}
        assert request.messages[-1]["role"] == "user" and request.index == trace.index(request)
    for agent in {r.agent for r in trace}:
        assert len(tokenizer.encode(system_prompt(agent))) >= 300
    calls = collections.Counter(m["content"] for r in trace for m in r.messages if m["content"].startswith("<tool_call>"))
    results = collections.Counter(r.messages[-1]["content"] for r in trace if r.messages[-1]["content"].startswith("Tool result"))
    assert len(calls) > 5 and max(calls.values()) > 1 and max(results.values()) > 1  # repeated calls and results
    half = len(trace) // 2
    assert len({r.conversation for r in trace[half:]}) >= 10  # the measured half spans conversations
    assert len(prose_prompts(3)) == 3


@pytest.mark.slow
def test_the_trace_section_runs_paired_and_lossless(embedded_target):
    import tsspec_ngram
    import tsspec_serve
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec_serve.bench import _Bench, _md_trace

    registry = SpeculatorRegistry()
    tsspec_ngram.tsspec_register_speculators(registry.register)
    tsspec_serve.tsspec_register_speculators(registry.register)
    result = _Bench(embedded_target, registry, 128.0).trace(max_tokens=3, conversations=2, seed=3, prose=1, limit=4)
    assert result["requests"] == 4
    assert result["warm"] == result["requests"] // 2 and result["pool_entries"] > 0
    assert result["measured"]["requests"] == result["requests"] - result["warm"]
    assert set(result["prose"]["tok_s"]) == {"ngram", "ngram-again", "pool"}
    assert any("ngram-pool" in line for line in _md_trace(result))
