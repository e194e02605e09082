"""The shipped learned drafter (tsspec-drafters-smollm2's NextN head) served to several clients at
once: each request drafts from its own context (a view of the one head per sequence), so its
output AND its acceptance equal the same request served alone, through the official client."""

from __future__ import annotations

import pytest

from tsspec.runtime.options import SpeculationOptions

openai = pytest.importorskip("openai")
drafters = pytest.importorskip("tsspec_drafters_smollm2")
pytest.importorskip("tsspec_draft_head")

MTP_FILE = drafters.HERE / "smollm2-135m-instruct-mtp.gguf"
# the governor off: its parks follow measured step times, which concurrency changes; with it on
# the drafts still come from the right context, but how many are made is a matter of timing
OPTIONS = SpeculationOptions(spec_type="draft-head", adaptive=False)
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def drafted_target(embedded_target):
    """The embedded model with the shipped MTP drafter attached (detached again afterwards)."""
    from tsspec_draft_head.nextn_file import attach_nextn

    if not MTP_FILE.is_file():
        pytest.skip("the shipped MTP drafter is not in this install")
    previous = embedded_target.draft_head
    attach_nextn(embedded_target, MTP_FILE)
    yield embedded_target
    embedded_target.draft_head = previous


def test_concurrent_requests_draft_and_accept_as_sequential_ones(drafted_target, served_alone_and_together):
    import tsspec_draft_head

    concurrent = served_alone_and_together(drafted_target, tsspec_draft_head, OPTIONS, "draft-head", seed=100)
    assert sum(r[2] for r in concurrent.values()) > 0  # the learned drafter lands drafts


CHATS = ("What is a list in Python?", "Name three rivers in Europe.")  # the default system prompt: a shared block


def _chat(live, content: str) -> dict:
    client = openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": content}],
                                           max_tokens=MAX_TOKENS, temperature=0)
    return {"text": reply.choices[0].message.content, **reply.model_extra["speculative"]}


def test_a_chat_after_another_drafts_on_the_shared_system_prompt_as_alone(drafted_target, live_server, engine_for):
    import tsspec_draft_head

    # the second chat adopts the first one's cached system-prompt block: the drafter arms anyway
    # (it shows a head the newest 8 rows, all in the new part here) and drafts exactly as the same
    # chat served first on an empty cache
    live = live_server(engine_for(drafted_target, tsspec_draft_head, OPTIONS))
    try:
        first, second = _chat(live, CHATS[0]), _chat(live, CHATS[1])
    finally:
        live.stop()
    live = live_server(engine_for(drafted_target, tsspec_draft_head, OPTIONS))
    try:
        alone = _chat(live, CHATS[1])
    finally:
        live.stop()
    assert first["prefix_reused"] == 0 and alone["prefix_reused"] == 0
    assert second["prefix_reused"] >= 16 and second["armed_after_reuse"] is True
    assert second["text"] == alone["text"]
    assert (second["draft_tokens"], second["accepted_tokens"]) == (alone["draft_tokens"], alone["accepted_tokens"])
    assert second["draft_tokens"] > 0
