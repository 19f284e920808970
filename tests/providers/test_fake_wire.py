"""The fakes speak the providers' real wire formats: every event validates against the official SDK types.

The SDKs parse streams leniently (no validation), so an adapter test alone would not notice a fake
that drifted from the real format; these tests validate each event strictly.
"""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.fakes.anthropic_api import message_events
from tests.fakes.model_script import Call, Failure, Reply
from tests.fakes.openai_api import chat_chunks, responses_events

REPLIES = {
    "text": Reply(text=["Hel", "lo"]),
    "calls": Reply(text=["On it."], calls=[Call("f", {"a": 1}), Call("g", '{"b": "x"}', fragments=1)]),
    "only_calls": Reply(calls=[Call("f", {"a": [1, 2]}, fragments=4)]),
    "cut_short": Reply(text=["par"], stop="max_output_tokens"),
    "failed": Reply(text=["par"], fail_after_text=Failure(500, "server_error", "boom")),
    "searched": Reply(text=["Found."], calls=[Call("f", {"a": 1})], searches=["switchboard", "gateway"]),
}


@pytest.mark.parametrize("reply", REPLIES.values(), ids=REPLIES.keys())
def test_responses_events_validate(reply: Reply) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    events = responses_events(reply, "gpt-test")

    parsed = [adapter.validate_python(data) for _, data in events]

    assert [event.type for event in parsed] == [name for name, _ in events]
    assert [event.sequence_number for event in parsed] == list(range(len(events)))
    assert parsed[-1].type in {"response.completed", "response.incomplete", "response.failed"}


@pytest.mark.parametrize("reply", REPLIES.values(), ids=REPLIES.keys())
def test_chat_chunks_validate(reply: Reply) -> None:
    if reply.stop is not None:
        reply = Reply(text=reply.text, stop="length")
    events = chat_chunks(reply, "llama-test", include_usage=True)

    data: list[Any] = [payload for _, payload in events]
    if reply.fail_after_text is not None:
        assert data[-1] == {"error": {"message": "boom", "type": "server_error", "param": None, "code": "server_error"}}
        data = data[:-1]
    else:
        assert data[-1] == "[DONE]"
        data = data[:-1]
        assert data[-1]["choices"] == [] and data[-1]["usage"]["total_tokens"] == 17
    for chunk in data:
        ChatCompletionChunk.model_validate(chunk)


@pytest.mark.parametrize("reply", REPLIES.values(), ids=REPLIES.keys())
def test_anthropic_events_validate(reply: Reply) -> None:
    if reply.stop is not None:
        reply = Reply(text=reply.text, stop="max_tokens")
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    events = message_events(reply, "claude-test")

    for name, data in events:
        assert data["type"] == name
        if name in ("ping", "error"):
            continue
        adapter.validate_python(data)
    assert events[-1][0] == ("error" if reply.fail_after_text else "message_stop")
