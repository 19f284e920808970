"""Anthropic Messages through the official ``anthropic`` SDK.

The neutral conversation becomes alternating ``user``/``assistant`` turns (tool results in the next user turn,
consecutive same-role entries merged), and the raw event stream folds into the neutral events of
:mod:`switchboard.core.model`; Anthropic's server-side web search is offered when the request asks for the hosted
search. Input tokens count cache reads and writes too, as all of them fill the context; the reads and writes are
also reported apart, as they are priced apart.

Prompt caching (when the request has a ``cache_key``): three ``cache_control`` breakpoints, on the last function
tool, on the system prompt and on the last block of the conversation. Anthropic's prefix order is tools, system,
messages, so the first two cache the agent's stable prefix across turns and the third lets the next step of the same
turn read the whole conversation so far from the cache.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import anthropic
import httpx2
from anthropic import AsyncAnthropic, omit
from anthropic.types import (
    ContentBlockParam,
    ImageBlockParam,
    InputJSONDelta,
    MessageParam,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    ServerToolUseBlock,
    TextBlockParam,
    ToolUnionParam,
    ToolUseBlock,
)
from anthropic.types import TextDelta as WireTextDelta

from switchboard.core.model import (
    ChatMessage,
    Finished,
    HostedSearch,
    ImagePart,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    Usage,
)
from switchboard.core.providers.errors import (
    ProviderFacts,
    auth_error,
    bad_response_error,
    status_error,
    stream_error,
    transport_error,
)
from switchboard.core.providers.transcript import paired, parse_arguments
from switchboard.errors import ModelError

__all__ = ["AnthropicModel"]

logger = logging.getLogger(__name__)

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
_NO_KEY = "unused"
"""Sent when no key is configured, so the SDK never goes looking for credentials on its own."""

HOSTED_SEARCHES = 5
"""Most server-side web searches Anthropic may run in one step (``max_uses``)."""

_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "refusal",
    "pause_turn": "pause",
    "model_context_window_exceeded": "context_length",
}


@dataclass
class _PendingCall:
    """A ``tool_use`` block whose input fragments are still arriving."""

    call_id: str
    name: str
    parts: list[str] = field(default_factory=list)

    def event(self) -> ToolCallEvent:
        return ToolCallEvent(
            call=ToolCall(id=self.call_id, name=self.name, arguments=parse_arguments("".join(self.parts)))
        )


class AnthropicModel:
    """A :class:`~switchboard.core.model.ModelAdapter` for Anthropic's Messages API.

    One SDK client per instance, kept for the instance's life so its connection pool is reused;
    call :meth:`aclose` when done.
    """

    provider = "anthropic"

    def __init__(self, *, api_key: str | None, base_url: str | None, timeout_s: float = 60.0) -> None:
        """Create the adapter.

        Args:
            api_key: ``ANTHROPIC_API_KEY``.
            base_url: ``ANTHROPIC_BASE_URL``; unset means Anthropic itself.
            timeout_s: Per-request timeout, also the longest silence tolerated inside a stream.
        """
        custom = base_url is not None and httpx2.URL(base_url).host != "api.anthropic.com"
        self._facts = ProviderFacts(
            name="Anthropic",
            key_env="ANTHROPIC_API_KEY",
            base_url_env="ANTHROPIC_BASE_URL",
            custom_endpoint=custom,
            secret=api_key or "",
        )
        # An explicit key (even a placeholder) stops the SDK reading env vars and profile files itself:
        # settings are read once, at the entry point.
        self._client = AsyncAnthropic(
            api_key=api_key or _NO_KEY,
            base_url=base_url or ANTHROPIC_BASE_URL,
            timeout=timeout_s,
            max_retries=0,
        )

    async def aclose(self) -> None:
        """Release the HTTP connection pool."""
        await self._client.close()

    @property
    def hosted_search(self) -> bool:
        """Anthropic's server-side ``web_search`` tool is there."""
        return True

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Run one step, yielding events as Anthropic produces them.

        Raises:
            ModelError: classified as described in :mod:`switchboard.core.providers.errors`.
        """
        events = self._messages(request)
        try:
            async for event in events:
                yield event
        except ModelError:
            raise
        except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
            raise auth_error(self._facts, status=exc.status_code) from None
        except anthropic.APIStatusError as exc:
            if exc.status_code == 200:  # an ``error`` event inside the stream
                raise stream_error(
                    self._facts, kind=exc.type, message=exc.api_message or exc.message, model=request.model
                ) from exc
            raise status_error(
                self._facts,
                status=exc.status_code,
                headers=exc.response.headers,
                kind=exc.type,
                message=exc.api_message or exc.message,
                model=request.model,
            ) from exc
        except anthropic.APITimeoutError as exc:
            raise transport_error(self._facts, timed_out=True) from exc
        except anthropic.APIConnectionError as exc:
            raise transport_error(self._facts, timed_out=False) from exc
        except json.JSONDecodeError as exc:  # a broken SSE ``data:`` line, raised by the SDK's stream decoder
            raise bad_response_error(self._facts, detail=exc.msg) from exc
        except httpx2.TimeoutException as exc:
            raise transport_error(self._facts, timed_out=True) from exc
        except httpx2.TransportError as exc:
            raise transport_error(self._facts, timed_out=False) from exc
        finally:
            await events.aclose()

    async def _messages(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        cached = request.cache_key is not None
        tools: list[ToolUnionParam] = [
            {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}
            for spec in request.tools
        ]
        if cached and tools:  # the agent's own catalog; the system prompt's breakpoint covers a hosted tool after it
            tools[-1] = cast(ToolUnionParam, {**tools[-1], "cache_control": {"type": "ephemeral"}})
        if request.hosted_search:
            tools.append({"type": "web_search_20250305", "name": "web_search", "max_uses": HOSTED_SEARCHES})
        system: str | list[TextBlockParam] = request.system
        if cached and request.system:  # a breakpoint needs the block form
            system = [{"type": "text", "text": request.system, "cache_control": {"type": "ephemeral"}}]
        messages = _messages(request.messages)
        if cached:
            _mark_last_block(messages)
        stream = await self._client.messages.create(
            model=request.model,
            system=system or omit,
            messages=messages,
            tools=tools or omit,
            max_tokens=request.max_output_tokens,
            stream=True,
        )
        pending: dict[int, _PendingCall] = {}
        searching: dict[int, list[str]] = {}  # server-side web searches: their input's fragments
        input_tokens = output_tokens = cache_read = cache_write = 0
        stop_reason: str | None = None
        stopped = False
        async with stream:
            async for event in stream:
                if isinstance(event, RawContentBlockDeltaEvent):
                    if isinstance(event.delta, WireTextDelta):
                        if event.delta.text:
                            yield TextDelta(text=event.delta.text)
                    elif isinstance(event.delta, InputJSONDelta) and event.index in pending:
                        pending[event.index].parts.append(event.delta.partial_json)
                    elif isinstance(event.delta, InputJSONDelta) and event.index in searching:
                        searching[event.index].append(event.delta.partial_json)
                elif isinstance(event, RawContentBlockStartEvent):
                    block = event.content_block
                    if isinstance(block, ToolUseBlock):
                        pending[event.index] = _PendingCall(call_id=block.id, name=block.name)
                    elif isinstance(block, ServerToolUseBlock) and block.name == "web_search":
                        searching[event.index] = []  # run by Anthropic: not a call for the gateway
                elif isinstance(event, RawContentBlockStopEvent):
                    call = pending.pop(event.index, None)
                    if call is not None:
                        yield call.event()
                    search = searching.pop(event.index, None)
                    if search is not None:  # Anthropic searched: what it read is outside text
                        query = parse_arguments("".join(search)).get("query")
                        yield HostedSearch(queries=[query[:400]] if isinstance(query, str) and query else [])
                elif isinstance(event, RawMessageStartEvent):
                    usage = event.message.usage
                    cache_write = usage.cache_creation_input_tokens or 0
                    cache_read = usage.cache_read_input_tokens or 0
                    input_tokens = usage.input_tokens + cache_write + cache_read
                    output_tokens = usage.output_tokens
                elif isinstance(event, RawMessageDeltaEvent):
                    stop_reason = event.delta.stop_reason or stop_reason
                    delta_usage = event.usage
                    output_tokens = delta_usage.output_tokens  # cumulative
                    if delta_usage.input_tokens is not None:
                        if delta_usage.cache_creation_input_tokens is not None:  # else as message_start said
                            cache_write = delta_usage.cache_creation_input_tokens
                        if delta_usage.cache_read_input_tokens is not None:
                            cache_read = delta_usage.cache_read_input_tokens
                        input_tokens = delta_usage.input_tokens + cache_write + cache_read
                elif isinstance(event, RawMessageStopEvent):
                    stopped = True
        if not stopped:
            raise stream_error(
                self._facts, kind=None, message="the stream ended before message_stop", model=request.model
            )
        for index in sorted(pending):
            yield pending[index].event()
        yield Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cache_read,
            cache_write_tokens=cache_write,
        )
        yield Finished(stop_reason=_STOP_REASONS.get(stop_reason or "end_turn", stop_reason or "stop"))


def _mark_last_block(messages: list[MessageParam]) -> None:
    """Put a cache breakpoint on the conversation's last block (its content is always a list of blocks here)."""
    if not messages:
        return
    content = messages[-1]["content"]
    if isinstance(content, list) and content:
        last = content[-1]
        if isinstance(last, dict):
            content[-1] = cast(ContentBlockParam, {**last, "cache_control": {"type": "ephemeral"}})


def _image_block(image: ImagePart) -> ImageBlockParam:
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    match image.mime_type:
        case "image/png" | "image/gif" | "image/webp" | "image/jpeg":
            media_type = image.mime_type
        case _:
            media_type = "image/jpeg"
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": image.data}}


def _messages(messages: Sequence[ChatMessage]) -> list[MessageParam]:
    """Alternating user/assistant turns; tool results ride in the user turn after the call."""
    turns: list[tuple[str, list[ContentBlockParam]]] = []
    for message in paired(messages):
        blocks: list[ContentBlockParam] = []
        if message.role == "tool":
            role = "user"
            blocks.append(
                {"type": "tool_result", "tool_use_id": message.tool_call_id or "", "content": message.content}
            )
        else:
            role = message.role
            for image in message.images:  # images first, then the text about them (Anthropic's advice)
                blocks.append(_image_block(image))
            if message.content.strip():  # the API refuses empty text blocks
                blocks.append({"type": "text", "text": message.content})
            for call in message.tool_calls:
                blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)})
        if not blocks:
            continue
        if turns and turns[-1][0] == role:
            # ``paired`` put results right after their call, so merging keeps them first in the user turn.
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    out: list[MessageParam] = []
    for role, blocks in turns:
        if role == "user":
            out.append({"role": "user", "content": blocks})
        else:
            out.append({"role": "assistant", "content": blocks})
    return out
