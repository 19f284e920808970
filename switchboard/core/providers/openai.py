"""OpenAI and OpenAI-compatible servers through the official ``openai`` SDK.

Two wire formats (``SWITCHBOARD_OPENAI_API``): ``responses`` for OpenAI itself (``store=false``: the gateway keeps the
conversation) and ``chat`` for every Chat Completions server (Ollama, vLLM, llama.cpp, Azure). Both streams fold into
the neutral events of :mod:`switchboard.core.model`; the SDK's own retries are off, the runtime retries on the
classified :class:`~switchboard.errors.ModelError`. On the Responses API it also compacts natively and offers the
hosted shell and the hosted web search. A request's ``cache_key`` goes out as ``prompt_cache_key`` on both wire formats
(OpenAI routes requests sharing it to the same prompt cache); the cached input tokens it reports come back in the
:class:`~switchboard.core.model.Usage`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Set
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import httpx2
import openai
from openai import AsyncOpenAI, omit
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
)
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.completion_usage import CompletionUsage
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseContainerReference,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionShellToolCall,
    ResponseFunctionShellToolCallOutput,
    ResponseFunctionToolCall,
    ResponseFunctionWebSearch,
    ResponseIncompleteEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseRefusalDeltaEvent,
    ResponseTextDeltaEvent,
    ToolParam,
)
from openai.types.responses.response import Response

from switchboard.core.agent.native import ContainerFile, NativeWindow
from switchboard.core.model import (
    Finished,
    HostedContainer,
    HostedSearch,
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
from switchboard.core.providers.openai_input import chat_messages, function_tool, responses_input
from switchboard.core.providers.openai_native import (
    HostedShellReport,
    compacted_items,
    container_files,
    hosted_search_tool,
    hosted_shell_tool,
    input_items,
    window_tokens,
)
from switchboard.core.providers.transcript import parse_arguments
from switchboard.errors import ModelError

__all__ = ["CONTAINER_FETCH_TIMEOUTS", "OpenAIModel"]

logger = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
_NO_KEY = "unused"
"""Sent when no key is configured: local OpenAI-compatible servers usually ignore it, and OpenAI answers 401."""

CONTAINER_FETCH_TIMEOUTS = 4
"""Copying a hosted container's files after a step ends within this many request timeouts."""

_CHAT_STOP_REASONS = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls"}
_INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "refusal"}


@dataclass
class _PendingCall:
    """A tool call whose argument fragments are still arriving."""

    call_id: str
    name: str
    parts: list[str] = field(default_factory=list)
    final: str | None = None

    def event(self) -> ToolCallEvent:
        raw = self.final if self.final is not None else "".join(self.parts)
        call_id = self.call_id or f"call_{uuid.uuid4().hex[:24]}"
        return ToolCallEvent(call=ToolCall(id=call_id, name=self.name, arguments=parse_arguments(raw)))


class OpenAIModel:
    """A :class:`~switchboard.core.model.ModelAdapter` for OpenAI and OpenAI-compatible servers.

    One SDK client per instance, kept for the instance's life so its connection pool is reused;
    call :meth:`aclose` when done.
    """

    provider = "openai"

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None,
        wire_api: Literal["responses", "chat"],
        timeout_s: float = 60.0,
    ) -> None:
        """Create the adapter.

        Args:
            api_key: ``OPENAI_API_KEY``; may be unset for local servers that need none.
            base_url: ``OPENAI_BASE_URL``; unset means OpenAI itself.
            wire_api: ``responses`` (OpenAI) or ``chat`` (Chat Completions, for compatible servers).
            timeout_s: Per-request timeout, also the longest silence tolerated inside a stream.
        """
        self.wire_api = wire_api
        self._timeout_s = timeout_s
        official = base_url is None or httpx2.URL(base_url).host == "api.openai.com"
        self._official = official
        self._facts = ProviderFacts(
            name="OpenAI" if official else "The OpenAI-compatible server",
            key_env="OPENAI_API_KEY",
            base_url_env="OPENAI_BASE_URL",
            custom_endpoint=not official,
            secret=api_key or "",
        )
        self._client = AsyncOpenAI(
            api_key=api_key or _NO_KEY,
            base_url=base_url or OPENAI_BASE_URL,
            timeout=timeout_s,
            max_retries=0,
        )

    async def aclose(self) -> None:
        """Release the HTTP connection pool."""
        await self._client.close()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Run one step, yielding events as the server produces them.

        Raises:
            ModelError: classified as described in :mod:`switchboard.core.providers.errors`.
        """
        events = self._responses(request) if self.wire_api == "responses" else self._chat(request)
        try:
            with self._translated(request.model):
                async for event in events:
                    yield event
        finally:
            await events.aclose()

    @property
    def native_compaction(self) -> bool:
        """Native compaction is there: on the Responses API (OpenAI's own, or a server speaking it)."""
        return self.wire_api == "responses"

    @property
    def hosted_search(self) -> bool:
        """The hosted web search is there: on the Responses API (OpenAI's ``web_search`` tool)."""
        return self.wire_api == "responses"

    async def compact(self, request: ModelRequest) -> NativeWindow:
        """The request's conversation compacted by ``POST /v1/responses/compact``, as items to send in its place.

        Only the model, the instructions and the conversation are sent (never tools or metadata).

        Raises:
            ModelError: classified as a failed step is; ``bad_response`` when the answer holds no compaction item.
        """
        if not self.native_compaction:
            raise ModelError("native compaction needs the Responses API", code="bad_request")
        with self._translated(request.model):
            raw = await self._client.responses.with_raw_response.compact(
                model=request.model,
                input=[*input_items(request.compacted), *responses_input(request.messages)],
                instructions=request.system or omit,
            )
            found = raw.parse()
            body = json.loads(raw.text)  # as sent: the SDK's output types have no user-message item
        items = compacted_items(body.get("output") if isinstance(body, dict) else None)
        if not any(item.get("type") == "compaction" for item in items):
            raise bad_response_error(self._facts, detail="the compacted window holds no compaction item")
        counted = getattr(getattr(found, "usage", None), "output_tokens", None)  # not validated: may be absent
        return NativeWindow(items=items, tokens=window_tokens(items, counted if isinstance(counted, int) else None))

    async def container_files(
        self, container_id: str, *, skip: Set[str], limit: int, max_bytes: int
    ) -> list[ContainerFile]:
        """Files the model's commands wrote in a hosted container (``source: assistant``), the newest ``limit``.

        Those whose id is in ``skip`` are not fetched; together they hold at most ``max_bytes``, and listing and
        downloads end within :data:`CONTAINER_FETCH_TIMEOUTS` times the request timeout (see
        :func:`~switchboard.core.providers.openai_native.container_files`).

        Raises:
            ModelError: classified as a failed step is.
        """
        try:
            with self._translated(""):
                return await container_files(
                    self._client.containers.files,
                    container_id,
                    skip=skip,
                    limit=limit,
                    max_bytes=max_bytes,
                    deadline_s=self._timeout_s * CONTAINER_FETCH_TIMEOUTS,
                )
        except TimeoutError:  # the listing's own deadline
            raise transport_error(self._facts, timed_out=True) from None

    @contextmanager
    def _translated(self, model: str) -> Iterator[None]:
        """What the SDK or the transport raises inside, as a classified :class:`ModelError`; the rest as it is."""
        try:
            yield
        except ModelError:
            raise
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            # The upstream text can echo part of the key: keep it out of messages and tracebacks.
            raise auth_error(self._facts, status=exc.status_code) from None
        except Exception as exc:
            error = self._classified(exc, model)
            if error is None:
                raise
            raise error from exc

    def _classified(self, exc: Exception, model: str) -> ModelError | None:
        """``exc`` (from the SDK or the transport) as a classified error; ``None`` for anything else."""
        if isinstance(exc, openai.APIStatusError):
            return status_error(
                self._facts,
                status=exc.status_code,
                headers=exc.response.headers,
                kind=exc.code or exc.type,
                message=exc.message if exc.body is None else _body_message(exc.body, exc.message),
                model=model,
            )
        if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException):
            return transport_error(self._facts, timed_out=True)
        if isinstance(exc, openai.APIConnectionError | httpx2.TransportError):
            return transport_error(self._facts, timed_out=False)
        if isinstance(exc, openai.APIError):  # an error object inside a 200 stream
            return stream_error(self._facts, kind=exc.code or exc.type, message=exc.message, model=model)
        if isinstance(exc, json.JSONDecodeError):  # a broken SSE ``data:`` line, raised by the SDK's stream decoder
            return bad_response_error(self._facts, detail=exc.msg)
        return None

    # -- Responses API ---------------------------------------------------------------------------

    async def _responses(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        metadata = dict(list(request.metadata.items())[:16]) or None
        tools: list[ToolParam] = [function_tool(spec.name, spec.description, spec.parameters) for spec in request.tools]
        if request.hosted_shell:
            tools.append(hosted_shell_tool())
        if request.hosted_search:
            tools.append(hosted_search_tool())
        stream = await self._client.responses.create(
            model=request.model,
            instructions=request.system or omit,
            input=[*input_items(request.compacted), *responses_input(request.messages)],
            tools=tools or omit,
            max_output_tokens=request.max_output_tokens,
            metadata=metadata if metadata is not None else omit,
            prompt_cache_key=request.cache_key if request.cache_key is not None else omit,
            store=False,
            stream=True,
        )
        pending: dict[int, _PendingCall] = {}
        calls = 0
        final: Response | None = None
        shell = HostedShellReport()
        containers: dict[str, None] = {}
        async with stream:
            async for event in stream:
                if isinstance(event, ResponseTextDeltaEvent | ResponseRefusalDeltaEvent):
                    if event.delta:
                        yield TextDelta(text=event.delta)
                elif isinstance(event, ResponseOutputItemAddedEvent):
                    if isinstance(event.item, ResponseFunctionToolCall):
                        pending[event.output_index] = _PendingCall(call_id=event.item.call_id, name=event.item.name)
                elif isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
                    pending.setdefault(event.output_index, _PendingCall("", "")).parts.append(event.delta)
                elif isinstance(event, ResponseFunctionCallArgumentsDoneEvent):
                    pending.setdefault(event.output_index, _PendingCall("", "")).final = event.arguments
                elif isinstance(event, ResponseOutputItemDoneEvent):
                    if isinstance(event.item, ResponseFunctionToolCall):
                        call = pending.pop(event.output_index, None) or _PendingCall("", "")
                        call.call_id, call.name = event.item.call_id or call.call_id, event.item.name or call.name
                        call.final = event.item.arguments if event.item.arguments else call.final
                        calls += 1
                        yield call.event()
                    elif isinstance(event.item, ResponseFunctionShellToolCall):
                        shell.call(event.item)  # run by OpenAI in its container: not a call for the gateway
                        if isinstance(event.item.environment, ResponseContainerReference):
                            containers[event.item.environment.container_id] = None
                    elif isinstance(event.item, ResponseFunctionWebSearch):
                        yield HostedSearch(queries=_search_queries(event.item))  # OpenAI searched: outside text
                    elif isinstance(event.item, ResponseFunctionShellToolCallOutput):
                        if not containers:  # it ran in a container no call named
                            containers[""] = None
                        yield TextDelta(text=shell.output(event.item))
                elif isinstance(event, ResponseCompletedEvent | ResponseIncompleteEvent):
                    final = event.response
                elif isinstance(event, ResponseFailedEvent):
                    error = event.response.error
                    raise stream_error(
                        self._facts,
                        kind=error.code if error else None,
                        message=error.message if error else "the response failed",
                        model=request.model,
                    )
                elif isinstance(event, ResponseErrorEvent):
                    raise stream_error(self._facts, kind=event.code, message=event.message, model=request.model)
        if final is None:
            raise stream_error(
                self._facts, kind=None, message="the stream ended before the response completed", model=request.model
            )
        for index in sorted(pending):
            calls += 1
            yield pending[index].event()
        for container_id in containers:
            yield HostedContainer(container_id=container_id)
        if final.usage is not None:
            details = getattr(final.usage, "input_tokens_details", None)  # the SDK does not validate the stream
            cached = getattr(details, "cached_tokens", None)
            yield Usage(
                input_tokens=final.usage.input_tokens,
                output_tokens=final.usage.output_tokens,
                cached_input_tokens=cached if isinstance(cached, int) else 0,
            )
        if final.status == "incomplete":
            reason = final.incomplete_details.reason if final.incomplete_details else None
            yield Finished(stop_reason=_INCOMPLETE_REASONS.get(reason or "", reason or "incomplete"))
        else:
            yield Finished(stop_reason="tool_calls" if calls else "stop")

    # -- Chat Completions ------------------------------------------------------------------------

    async def _chat(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        tools: list[ChatCompletionFunctionToolParam] = [
            {
                "type": "function",
                "function": {"name": spec.name, "description": spec.description, "parameters": spec.parameters},
            }
            for spec in request.tools
        ]
        stream = await self._client.chat.completions.create(
            model=request.model,
            messages=chat_messages(request.system, request.messages),
            tools=tools or omit,
            # OpenAI's newer models only take ``max_completion_tokens``; compatible servers know ``max_tokens``.
            max_completion_tokens=request.max_output_tokens if self._official else omit,
            max_tokens=omit if self._official else request.max_output_tokens,
            prompt_cache_key=request.cache_key if request.cache_key is not None else omit,
            stream=True,
            stream_options={"include_usage": True},
        )
        current: _PendingCall | None = None
        current_key: int | None = None
        usage: CompletionUsage | None = None
        finish: str | None = None
        async with stream:
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices or []:
                    # The SDK does not validate chunks; some compatible servers leave out ``index`` or ``delta``.
                    if getattr(choice, "index", 0) != 0:
                        continue
                    delta: ChoiceDelta | None = getattr(choice, "delta", None)
                    text = ((delta.content or "") + (delta.refusal or "")) if delta is not None else ""
                    if text:
                        yield TextDelta(text=text)
                    for fragment in (delta.tool_calls if delta is not None else None) or []:
                        index = getattr(fragment, "index", None)
                        key = index if isinstance(index, int) else current_key
                        # Some servers reuse index 0 for every call; a new id then starts a new call.
                        renamed = bool(fragment.id and current and current.call_id and fragment.id != current.call_id)
                        if current is None or key != current_key or renamed:
                            if current is not None:
                                yield current.event()
                            current, current_key = _PendingCall(fragment.id or "", ""), key
                        function = fragment.function
                        if function is not None:
                            if function.name and not current.name:
                                current.name = function.name
                            if function.arguments:
                                current.parts.append(function.arguments)
                    if getattr(choice, "finish_reason", None) is not None:
                        finish = choice.finish_reason
                        if current is not None:
                            yield current.event()
                        current, current_key = None, None
        if finish is None:
            raise stream_error(
                self._facts, kind=None, message="the stream ended without a finish reason", model=request.model
            )
        if usage is not None:
            details = getattr(usage, "prompt_tokens_details", None)  # compatible servers often leave it out
            cached = getattr(details, "cached_tokens", None)
            yield Usage(
                input_tokens=usage.prompt_tokens,
                output_tokens=usage.completion_tokens,
                cached_input_tokens=cached if isinstance(cached, int) else 0,
            )
        yield Finished(stop_reason=_CHAT_STOP_REASONS.get(finish, "refusal" if finish == "content_filter" else finish))


def _search_queries(item: ResponseFunctionWebSearch) -> list[str]:
    """What a hosted ``web_search_call`` searched for (the SDK does not validate what the server streamed)."""
    action = getattr(item, "action", None)
    if getattr(action, "type", None) != "search":
        return []
    queries = getattr(action, "queries", None) or [getattr(action, "query", None)]
    return [str(query)[:400] for query in queries if isinstance(query, str) and query][:10]


def _body_message(body: object, fallback: str) -> str:
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    return fallback
