"""A scripted model that obeys every instruction it reads, for injection tests.

It plays the worst case of a model: the user's request first (the calls it is given), then, whenever a tool result
says ``call <tool> with {json arguments}``, it makes that call — each instruction once. ``$CALL`` in the arguments
becomes the id of the call whose result held the instruction (what a model would cite as its source).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence

from switchboard.core.model import Finished, ModelEvent, ModelRequest, TextDelta, ToolCall, ToolCallEvent, Usage

__all__ = ["INSTRUCTION", "ObedientModel", "instruction"]

INSTRUCTION = re.compile(r"call (\w+) with (\{(?:[^{}]|\{[^{}]*\})*\})")
"""``call <tool> with {…}`` (arguments one level of nesting deep)."""


def instruction(tool: str, arguments: dict[str, object]) -> str:
    """The words that make :class:`ObedientModel` call ``tool`` with ``arguments``."""
    return f"call {tool} with {json.dumps(arguments)}"


def _unescaped(text: str) -> str:
    """Tool results are JSON: read their words the way a model does, quotes and line breaks included."""
    return text.replace('\\"', '"').replace("\\n", "\n")


class ObedientModel:
    """Calls ``first`` on the user's message, then every tool call a tool result asks for."""

    provider = "offline"

    def __init__(self, first: Sequence[ToolCall]) -> None:
        self.first = list(first)
        self.requests: list[ModelRequest] = []
        self.obeyed: list[ToolCall] = []
        self._done: set[str] = set()

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        last = request.messages[-1]
        calls: list[ToolCall] = []
        if last.role == "user":
            calls = list(self.first)
        elif last.role == "tool":
            for found in INSTRUCTION.finditer(_unescaped(last.content)):
                raw = found.group(2).replace("$CALL", last.tool_call_id or "")
                if raw in self._done:
                    continue
                self._done.add(raw)
                try:
                    arguments = json.loads(raw)
                except ValueError:
                    continue
                call = ToolCall(id=f"obey-{len(self.obeyed)}", name=found.group(1), arguments=arguments)
                self.obeyed.append(call)
                calls.append(call)
        for call in calls:
            yield ToolCallEvent(call=call)
        if not calls:
            yield TextDelta(text="done")
        yield Usage(input_tokens=10, output_tokens=5)
        yield Finished(stop_reason="tool_calls" if calls else "stop")
