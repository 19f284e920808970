"""A fake Anthropic Messages API: ``POST /v1/messages``, streaming over SSE.

Speaks the wire format the official ``anthropic`` SDK parses (checked against its types in
``tests/providers/test_fake_wire.py``): ``message_start``, ``content_block_start`` (text / tool_use),
``content_block_delta`` (``text_delta``, ``input_json_delta``), ``content_block_stop``,
``message_delta`` (usage, stop_reason), ``message_stop``, plus ``ping`` and in-stream ``error`` events; server-side
web searches (:attr:`Reply.searches`) as ``server_tool_use`` and ``web_search_tool_result`` blocks.
Every event carries its ``event:`` line, which the SDK needs. Errors use Anthropic's body shape
``{"type": "error", "error": {"type", "message"}}``; its 401 deliberately echoes the presented key, so
tests prove the adapter never repeats upstream text for auth failures.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from aiohttp import web

from tests.fakes.model_script import GARBLED, Failure, Received, Reply, Script, split

__all__ = ["FakeAnthropic", "error_body", "message_events"]

Event = tuple[str, dict[str, Any]]


def error_body(failure: Failure) -> dict[str, Any]:
    """Anthropic's error shape."""
    return {"type": "error", "error": {"type": failure.kind, "message": failure.message}, "request_id": "req_fake"}


def message_events(reply: Reply, model: str) -> list[Event]:
    """The Messages event stream for ``reply``."""
    usage = {
        "input_tokens": reply.input_tokens - reply.cached_input_tokens - reply.cache_write_tokens,
        "output_tokens": 1,
        "cache_creation_input_tokens": reply.cache_write_tokens,
        "cache_read_input_tokens": reply.cached_input_tokens,
    }
    message: dict[str, Any] = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    events: list[Event] = [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]
    index = 0
    for query in reply.searches:
        events += _search_events(query, index)
        index += 2
    if reply.text:
        block: dict[str, Any] = {"type": "text", "text": ""}
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        for text in reply.text:
            delta = {"type": "text_delta", "text": text}
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        if reply.fail_after_text is not None:
            events.append(("error", error_body(reply.fail_after_text)))
            return events
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    elif reply.fail_after_text is not None:
        events.append(("error", error_body(reply.fail_after_text)))
        return events
    for call in reply.calls:
        block = {"type": "tool_use", "id": call.call_id, "name": call.name, "input": {}}
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        for fragment in split(call.raw, call.fragments):
            delta = {"type": "input_json_delta", "partial_json": fragment}
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    stop = reply.stop or ("tool_use" if reply.calls else "end_turn")
    final = {
        "type": "message_delta",
        "delta": {"stop_reason": stop, "stop_sequence": None},
        "usage": {"output_tokens": reply.output_tokens},
    }
    events.append(("message_delta", final))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _search_events(query: str, index: int) -> list[Event]:
    """A server-side web search as Anthropic streams it: a ``server_tool_use`` block, then its result block."""
    use_id = f"srvtoolu_{index:04d}"
    use = {"type": "server_tool_use", "id": use_id, "name": "web_search", "input": {}}
    delta = {"type": "input_json_delta", "partial_json": json.dumps({"query": query})}
    found = [
        {
            "type": "web_search_result",
            "title": "Found",
            "url": "https://example.org/found",
            "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5LTQ1NGUtODgxNC1kNjNjNTk1ZWI3Y2IS",
            "page_age": "April 30, 2026",
        }
    ]
    result = {"type": "web_search_tool_result", "tool_use_id": use_id, "content": found}
    return [
        ("content_block_start", {"type": "content_block_start", "index": index, "content_block": use}),
        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ("content_block_start", {"type": "content_block_start", "index": index + 1, "content_block": result}),
        ("content_block_stop", {"type": "content_block_stop", "index": index + 1}),
    ]


class FakeAnthropic(Script):
    """The fake server's state: the script, the received requests and the aiohttp app."""

    def images(self) -> list[dict[str, Any]]:
        """Every ``image`` block the requests carried (their ``source``), in order."""
        return [
            block["source"]
            for received in self.received
            for message in received.body.get("messages", [])
            if isinstance(message.get("content"), list)
            for block in message["content"]
            if block.get("type") == "image"
        ]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/messages", self._messages)
        return app

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(
            Received(path=request.path, headers={k.lower(): v for k, v in request.headers.items()}, body=body)
        )
        # Anthropic takes the key as ``x-api-key`` or as a bearer token (what SDK 2.x sends).
        presented = request.headers.get("x-api-key") or request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and presented != self.api_key:
            failure = Failure(status=401, kind="authentication_error", message=f"invalid x-api-key: {presented}")
            return web.json_response(error_body(failure), status=401, headers={"request-id": "req_fake"})
        item = self.next()
        if isinstance(item, Failure) and not item.mid_stream:
            headers = {"request-id": "req_fake", **item.headers}
            return web.json_response(error_body(item), status=item.status, headers=headers)
        if not body.get("stream"):
            failure = Failure(400, "invalid_request_error", "fake: stream only")
            return web.json_response(error_body(failure), status=400)
        reply = item if isinstance(item, Reply) else Reply(fail_after_text=item)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for n, (name, data) in enumerate(message_events(reply, body.get("model", ""))):
                if reply.stall_after is not None and n == reply.stall_after:
                    await self.stall()
                if reply.garble_after is not None and n == reply.garble_after:
                    await response.write(f"event: {name}\ndata: {GARBLED}\n\n".encode())
                    break
                await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            await response.write_eof()
        return response
