"""One model step: stream the provider's events, pass text on as it arrives, fold the rest into a decision.

:func:`decide` is the runtime's only contact with a :class:`~switchboard.core.model.ModelAdapter`. Retryable provider
errors are retried with back-off only while nothing has been streamed yet, so the user never sees text twice. The
stream is always closed, also on cancellation, which is how ``/stop`` reaches the provider's HTTP request.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from switchboard.core.agent.budget import StepTokens
from switchboard.core.agent.prompt import RUN_PROGRAM
from switchboard.core.model import (
    Decision,
    FinalAnswer,
    ModelAdapter,
    ModelEvent,
    ModelRequest,
    Program,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolCalls,
    Usage,
)
from switchboard.core.turn import TurnSink
from switchboard.errors import ModelError
from switchboard.tracing import current_conversation, span

__all__ = ["CUT_NOTICE", "Reply", "StepRetry", "decide", "fold"]

logger = logging.getLogger(__name__)


CUT_NOTICE = "\n\n[reply cut at {cap} characters: the agent's output limit]"
"""Ends a reply that reached the output cap, so the user knows there was more."""


class Reply:
    """The reply as streamed to the sink: capped at ``cap`` characters, steps separated by a blank line.

    Text past the cap is dropped, and the reply says so once (:data:`CUT_NOTICE`); ``cut`` records it.
    """

    def __init__(self, sink: TurnSink, cap: int) -> None:
        self.sink = sink
        self.cap = cap
        self.parts: list[str] = []
        self.chars = 0
        self.cut = False
        """The reply reached the cap and text was dropped."""
        self._step = 0

    @property
    def text(self) -> str:
        """Everything streamed so far (the turn's final text)."""
        return "".join(self.parts)

    async def write(self, text: str, step: int) -> None:
        """Stream a piece of step ``step``'s text (dropped once the cap is reached)."""
        if step != self._step:
            self._step = step
            if self.chars:
                text = "\n\n" + text
        room = self.cap - self.chars
        if self.cut or not text:
            return
        piece = text[:room]
        if len(piece) < len(text):
            self.cut = True
            piece += CUT_NOTICE.format(cap=f"{self.cap:,}")
        self.parts.append(piece)
        self.chars += len(piece)
        await self.sink.delta(piece)


@dataclass(frozen=True)
class StepRetry:
    """How a step retries retryable provider errors."""

    attempts: int = 4
    backoff_s: float = 0.5
    """Base of the exponential back-off (full jitter); ``retry_after`` from the provider wins when longer."""


def fold(text: str, calls: list[ToolCall]) -> Decision:
    """A step's text and calls as one decision."""
    if not calls:
        return FinalAnswer(text=text)
    if len(calls) == 1 and calls[0].name == RUN_PROGRAM:
        code = calls[0].arguments.get("code")
        return Program(code=code if isinstance(code, str) else "", call_id=calls[0].id, text=text)
    return ToolCalls(calls=calls, text=text)


async def decide(
    adapter: ModelAdapter,
    request: ModelRequest,
    reply: Reply,
    step: int,
    *,
    retry: StepRetry,
    remaining_s: Callable[[], float],
) -> tuple[Decision, StepTokens]:
    """Run one model step; returns the decision and the tokens it used.

    Each attempt is a ``model.call`` span with the OpenTelemetry GenAI attributes (operation, provider, model,
    token usage, the conversation's digest); never the prompt or the answer.

    Raises:
        ModelError: not retryable, retries used up, text already streamed, or no time left to wait.
    """
    attempt = 0
    while True:
        attempt += 1
        progress = _Progress()
        try:
            with span(
                "model.call",
                gen_ai__operation__name="chat",
                gen_ai__provider__name=adapter.provider,
                gen_ai__request__model=request.model,
                gen_ai__request__max_tokens=request.max_output_tokens,
                gen_ai__conversation__id=current_conversation(),
                switchboard__step=step,
                switchboard__attempt=attempt,
            ) as opened:
                try:
                    decision, usage = await _attempt(adapter, request, reply, step, progress)
                except ModelError as err:
                    opened.set_attribute("switchboard.error_code", err.code or "error")
                    raise
                opened.set_attribute("gen_ai.usage.input_tokens", usage[0])
                opened.set_attribute("gen_ai.usage.output_tokens", usage[1])
                if usage.cached:
                    opened.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached)
                opened.set_attribute("switchboard.decision", decision.kind)
        except ModelError as err:
            if not err.retryable or progress.received or attempt >= retry.attempts:
                raise
            delay = max(err.retry_after or 0.0, random.uniform(0, retry.backoff_s * 2 ** (attempt - 1)))
            if delay >= remaining_s():
                raise
            logger.info("model step failed (%s); retry %d in %.2fs", err.code or "error", attempt, delay)
            await asyncio.sleep(delay)
            continue
        return decision, usage


class _Progress:
    """What an attempt got before it failed: once the provider sent anything, the step is not retried."""

    __slots__ = ("received",)

    def __init__(self) -> None:
        self.received = False


async def _attempt(
    adapter: ModelAdapter, request: ModelRequest, reply: Reply, step: int, progress: _Progress
) -> tuple[Decision, StepTokens]:
    """One attempt at the step: stream the provider's events (text on to the reply), always closing the stream."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    tokens_in = tokens_out = cached = written = 0
    stream: AsyncIterator[ModelEvent] = adapter.stream(request)
    try:
        async for event in stream:
            progress.received = True
            if isinstance(event, TextDelta):
                texts.append(event.text)
                await reply.write(event.text, step)
            elif isinstance(event, ToolCallEvent):
                calls.append(event.call)
            elif isinstance(event, Usage):  # some providers report in parts; never double-count
                tokens_in, tokens_out = max(tokens_in, event.input_tokens), max(tokens_out, event.output_tokens)
                cached, written = max(cached, event.cached_input_tokens), max(written, event.cache_write_tokens)
    finally:
        closer = getattr(stream, "aclose", None)
        if closer is not None:
            await closer()
    return fold("".join(texts), calls), StepTokens(tokens_in, tokens_out, cached, written)
