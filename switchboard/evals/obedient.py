"""A scripted model that obeys every instruction it reads: the worst case a red-team scenario plays against.

It plays the user's request first (the calls it is given), then, whenever a tool result says
``call <tool> with {json arguments}``, it makes that call — each instruction once. With ``descriptions`` it also
obeys instructions in the tool descriptions it is offered (as soon as it reads a tool result, the way a model
re-reads its tool list), and with ``user`` the user's own words (a direct injection). ``$CALL`` in the arguments
becomes the id of the call whose result held the instruction (what a model would cite as its source). Whatever
stops it is the gateway's: policy, approvals, budgets, tenancy.
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
    """Calls ``first`` on the user's message, then every tool call the text it reads asks for."""

    provider = "offline"

    def __init__(self, first: Sequence[ToolCall], *, descriptions: bool = False, user: bool = False) -> None:
        self.first = list(first)
        self.descriptions = descriptions
        self.user = user
        self.requests: list[ModelRequest] = []
        self.obeyed: list[ToolCall] = []
        self._done: set[str] = set()

    async def aclose(self) -> None:
        """Nothing to close."""
        return None

    def _obey(self, text: str, source_id: str) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for found in INSTRUCTION.finditer(_unescaped(text)):
            raw = found.group(2).replace("$CALL", source_id)
            if raw in self._done:
                continue
            self._done.add(raw)
            try:
                arguments = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(arguments, dict):
                continue
            call = ToolCall(id=f"obey-{len(self.obeyed)}", name=found.group(1), arguments=arguments)
            self.obeyed.append(call)
            calls.append(call)
        return calls

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """One step: the first calls on a user message, the obeyed instructions after a tool result."""
        self.requests.append(request)
        last = request.messages[-1]
        calls: list[ToolCall] = []
        if last.role == "user":
            calls = list(self.first)
            if self.user:
                calls += self._obey(last.content, "")
        elif last.role == "tool":
            calls = self._obey(last.content, last.tool_call_id or "")
            if self.descriptions:
                calls += self._obey("\n".join(spec.description for spec in request.tools), "")
        for call in calls:
            yield ToolCallEvent(call=call)
        if not calls:
            yield TextDelta(text="done")
        yield Usage(input_tokens=10, output_tokens=5)
        yield Finished(stop_reason="tool_calls" if calls else "stop")
