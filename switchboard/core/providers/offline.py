"""The deterministic offline model: demos and tests without a provider key.

The same request always gives the same events (:class:`OfflineModel` lists what it answers); it reports usage and can
sleep per step, so it stands in for a slow model in load tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from switchboard.core.agent.prompt import FINAL_NOTE_HEADING, RUN_PROGRAM, WORK_LOG_MARKER
from switchboard.core.model import (
    ChatMessage,
    Finished,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    Usage,
)

__all__ = ["OfflineModel"]

_TIME = re.compile(r"what time is it|current time|time is it|what'?s the time", re.IGNORECASE)
_ZONE = re.compile(r"\bin ([A-Za-z]+(?:/[A-Za-z_+\-]+)+|UTC)\b")
_TOOL_COMMAND = re.compile(r"^/tool\s+([A-Za-z_][A-Za-z0-9_.]*)\s*(.*)$", re.DOTALL)
_BUDGET = re.compile(r"\(([a-z_]+); used: ")
_CHUNK_WORDS = 3


def _words(text: str) -> int:
    return len(text.split())


def _call_id(request: ModelRequest, name: str) -> str:
    """A call id that depends only on the request, so replays and re-runs see the same ids."""
    seed = f"{len(request.messages)}\n{name}\n{request.messages[-1].content if request.messages else ''}"
    return "call_" + hashlib.sha256(seed.encode()).hexdigest()[:16]


class OfflineModel:
    """A :class:`~switchboard.core.model.ModelAdapter` that needs no network.

    What it does, step by step (the same request always gives the same events):

    - a plain message → ``You said: "<the text, verbatim>"`` plus one fixed sentence, streamed word by word;
    - "what time is it" / "current time" / "time is it" (any case), with ``current_time`` among the tools →
      a ``current_time`` call (``in Area/City`` picks the zone), then on the next step an answer with the time;
    - ``/run <code>`` with ``run_program`` among the tools → a CodeAct program (the rest of the text);
    - ``/tool <name> <json>`` → that tool call (handy for demos of slots and files);
    - a request without tools at a budget → says which budget ran out, what was done and what was not;
    - after any other tool result → reports the result briefly.

    It reports :class:`Usage` (words counted as tokens) and sleeps ``delay_ms`` once per step, so it can
    stand in for a slow model in load tests.
    """

    provider = "offline"

    def __init__(self, *, delay_ms: int = 0) -> None:
        self.delay_ms = delay_ms

    async def aclose(self) -> None:
        """Nothing to release."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """One step: either a tool call or an answer streamed in word chunks."""
        call = self._tool_call(request)
        if self.delay_ms:
            # Half the delay before the first token (all of it for a tool call), the rest spread over the deltas.
            await asyncio.sleep(self.delay_ms / 1000 / (1 if call is not None else 2))
        input_tokens = _words(request.system) + sum(_words(m.content) for m in request.messages)
        if call is not None:
            yield ToolCallEvent(call=call)
            yield Usage(input_tokens=input_tokens, output_tokens=_words(json.dumps(call.arguments)) + 1)
            yield Finished(stop_reason="tool_calls")
            return
        text = self._answer(request)
        words = text.split(" ")
        starts = range(0, len(words), _CHUNK_WORDS)
        for start in starts:
            if start and self.delay_ms:
                await asyncio.sleep(self.delay_ms / 2000 / max(len(starts) - 1, 1))
            piece = " ".join(words[start : start + _CHUNK_WORDS])
            yield TextDelta(text=piece if start == 0 else " " + piece)
        yield Usage(input_tokens=input_tokens, output_tokens=_words(text))
        yield Finished(stop_reason="stop")

    # ---------------------------------------------------------------- decisions

    @staticmethod
    def _last_user(request: ModelRequest) -> str:
        for message in reversed(request.messages):
            if message.role == "user" and message.trust_class == "user":
                return message.content
        return ""

    def _tool_call(self, request: ModelRequest) -> ToolCall | None:
        if not request.tools or not request.messages or request.messages[-1].role != "user":
            return None
        names = {t.name for t in request.tools}
        text = self._last_user(request).strip()
        command = _TOOL_COMMAND.match(text)
        if command:
            name, raw = command.group(1), command.group(2).strip()
            try:
                args: Any = json.loads(raw) if raw else {}
            except (ValueError, RecursionError):  # RecursionError: a user's thousands of "["
                args = {"_raw": raw}
            if not isinstance(args, dict):
                args = {"_raw": raw}
            return ToolCall(id=_call_id(request, name), name=name, arguments=args)
        if text.startswith("/run ") and RUN_PROGRAM in names:
            return ToolCall(id=_call_id(request, RUN_PROGRAM), name=RUN_PROGRAM, arguments={"code": text[5:]})
        if _TIME.search(text) and "current_time" in names:
            zone = _ZONE.search(text)
            arguments = {"timezone": zone.group(1)} if zone else {}
            return ToolCall(id=_call_id(request, "current_time"), name="current_time", arguments=arguments)
        return None

    def _answer(self, request: ModelRequest) -> str:
        last = request.messages[-1] if request.messages else ChatMessage(role="user")
        if last.role == "tool":
            return self._after_tool(request, last)
        text = self._last_user(request)
        if FINAL_NOTE_HEADING in request.system and not request.tools:
            return self._final(request, text)
        return f'You said: "{text}". I am the offline model, so I answer by repeating your message.'

    @staticmethod
    def _after_tool(request: ModelRequest, result: ChatMessage) -> str:
        name = result.name or "the tool"
        try:
            value: Any = json.loads(result.content)
        except ValueError:
            value = result.content
        if isinstance(value, dict) and "error" in value:
            return f"{name} failed: {value['error']}"
        if name == "current_time" and isinstance(value, dict) and "time" in value:
            return f"It is {value['time']} on {value.get('weekday', '')} {value.get('date', '')} ({value['timezone']})."
        if name == RUN_PROGRAM and isinstance(value, dict):
            printed = str(value.get("output", "")).strip()
            return f"The program printed: {printed or '(nothing)'}; its value: {json.dumps(value.get('value'))}."
        shown = result.content if len(result.content) <= 300 else result.content[:300] + "…"
        return f"{name} returned: {shown}"

    @staticmethod
    def _final(request: ModelRequest, text: str) -> str:
        found = _BUDGET.search(request.system)
        reason = found.group(1) if found else "turn"
        log = ""
        for message in request.messages:
            if WORK_LOG_MARKER in message.content:
                log = message.content.split(WORK_LOG_MARKER, 1)[1]
        calls = [line[len("- called ") :].split("(", 1)[0] for line in log.splitlines() if line.startswith("- called ")]
        done = f"{len(calls)} tool call(s) ({', '.join(sorted(set(calls)))})" if calls else "no tool calls"
        return (
            f'You said: "{text}". I had to stop: the {reason} budget ran out. '
            f"Done: {done}. Not done: anything after that point; ask again to continue."
        )
