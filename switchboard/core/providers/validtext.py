r"""Model output made encodable: lone surrogates in text and tool calls become U+FFFD at the adapter boundary.

A model, or an endpoint posing as one, may send JSON escapes of lone UTF-16 surrogates (``"\ud800"``): valid JSON,
but no UTF-8 encoder takes the string it decodes to, so every later write of the turn (the history, the event log,
the channel, the idempotency hash) would fail on it. :class:`ValidTextAdapter` replaces them as the events arrive,
so a tool named with one is an ordinary correctable error and a reply holding one is delivered readably. Arguments
nested absurdly deep (which would exhaust the interpreter's stack somewhere later) become the gateway's
malformed-arguments shape at the same boundary.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final

from switchboard.core.model import ModelAdapter, ModelEvent, ModelRequest, TextDelta, ToolCall, ToolCallEvent

__all__ = ["MAX_ARGUMENT_DEPTH", "REPLACEMENT", "ValidTextAdapter", "valid_arguments", "valid_text"]

REPLACEMENT: Final = "\ufffd"
"""What a lone surrogate becomes."""
MAX_ARGUMENT_DEPTH: Final = 32
"""Deepest nesting of a tool call's arguments (no tool needs more); deeper ones would exhaust the stack later."""
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def valid_text(value: Any) -> Any:
    """``value`` (a string, or JSON-like dicts and lists of them) with every lone surrogate replaced."""
    if isinstance(value, str):
        return value if value.isascii() else _SURROGATE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {valid_text(key): valid_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [valid_text(item) for item in value]
    return value


def _depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests lists and dicts, counted without recursion and up to ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            if level > limit:
                return level
            deepest = max(deepest, level)
            stack.extend((child, level) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def valid_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments made encodable.

    Arguments nesting deeper than :data:`MAX_ARGUMENT_DEPTH` become ``{"_raw": …}``, the gateway's shape for
    malformed arguments (a correctable error for the model).
    """
    if _depth(arguments, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
        return {"_raw": f"arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels"}
    found: dict[str, Any] = valid_text(arguments)
    return found


class ValidTextAdapter:
    """A :class:`~switchboard.core.model.ModelAdapter` whose text deltas and tool calls are always encodable."""

    def __init__(self, inner: ModelAdapter) -> None:
        """Wrap ``inner``; its provider name is kept."""
        self.inner = inner
        self.provider = inner.provider

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """The inner adapter's events, strings made encodable.

        Raises:
            ModelError: as the inner adapter raises it.
        """
        events = self.inner.stream(request)
        try:
            async for event in events:
                if isinstance(event, TextDelta) and not event.text.isascii():
                    yield TextDelta(text=valid_text(event.text))
                elif isinstance(event, ToolCallEvent):
                    call = event.call
                    yield ToolCallEvent(
                        call=ToolCall(
                            id=valid_text(call.id),
                            name=valid_text(call.name),
                            arguments=valid_arguments(call.arguments),
                        )
                    )
                else:
                    yield event
        finally:
            if isinstance(events, AsyncGenerator):  # closed with this one, so a cancelled step ends the provider's
                await events.aclose()

    async def aclose(self) -> None:
        """Release the inner adapter."""
        await self.inner.aclose()
