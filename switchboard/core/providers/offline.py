"""The deterministic offline model: demos and tests without a provider key.

The same request always gives the same events (:class:`OfflineModel` lists what it answers); it reports usage and can
sleep per step, so it stands in for a slow model in load tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from switchboard.core.agent.prompt import FINAL_NOTE_HEADING, RUN_PROGRAM, WORK_LOG_MARKER
from switchboard.core.knowledge.summaries import SUMMARY_INSTRUCTIONS, extractive_summary
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

    - a plain message → ``You said: "<the text, verbatim>"`` plus one fixed sentence, streamed word by word (text
      with Markdown blocks or quotes is repeated as a block of its own, so a table or a quote stays one);
    - "what time is it" / "current time" / "time is it" (any case), with ``current_time`` among the tools →
      a ``current_time`` call (``in Area/City`` picks the zone), then on the next step an answer with the time;
    - ``/run <code>`` with ``run_program`` among the tools → a CodeAct program (the rest of the text);
    - ``/tool <name> <json>`` → that tool call (handy for demos of slots and files);
    - a knowledge summary request (:mod:`switchboard.core.knowledge.summaries`) → the document's first sentences;
    - a request without tools at a budget → says which budget ran out, what was done and what was not;
    - after any other tool result → reports it readably: each shell command with its exit status and output (head
      and tail when long), SQL rows as a table, a short summary of other tools' results.

    The commands are written for people trying the gateway (docs/getting-started.md lists the demo agent's).

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
        if request.system == SUMMARY_INSTRUCTIONS and not request.tools:
            return extractive_summary(_unwrapped(last.content))
        if last.role == "tool":
            return self._after_tool(request, last)
        text = self._last_user(request)
        if FINAL_NOTE_HEADING in request.system and not request.tools:
            return self._final(request, text)
        return _echo(text, "I am the offline model, so I answer by repeating your message.")

    @staticmethod
    def _after_tool(request: ModelRequest, result: ChatMessage) -> str:
        name = result.name or "the tool"
        content = _unwrapped(result.content)
        try:
            value: Any = json.loads(content)
        except (ValueError, RecursionError):
            value = content
        if not isinstance(value, dict):
            return f"{name} returned:\n\n{_fenced(_head_tail(str(value)))}"
        if name == "shell" and isinstance(value.get("output"), list):
            return _shell(value, _arguments(request, result).get("commands"))
        if "error" in value:
            return f"{name} failed: {value['error']}"
        if name == "current_time" and "time" in value:
            return f"It is {value['time']} on {value.get('weekday', '')} {value.get('date', '')} ({value['timezone']})."
        if name == RUN_PROGRAM:
            printed = str(value.get("output", "")).strip()
            if not printed:
                shown = "The program printed nothing."
            elif "\n" in printed or len(printed) > 200:
                shown = f"The program printed:\n\n{_fenced(_head_tail(printed))}"
            else:
                shown = f"The program printed: {printed}"
            return shown + ("" if value.get("value") is None else f"\n\nIts value: {_code(_short(value['value']))}.")
        summary = _SUMMARIES.get(name)
        brief = summary(value) if summary is not None else None
        return f"{name} returned: {brief}" if brief is not None else _summary(name, value)

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
        return _echo(
            text,
            f"I had to stop: the {reason} budget ran out. Done: {done}. Not done: anything after that point; ask again "
            "to continue.",
        )


# ---------------------------------------------------------------- rendering

_BLOCK = re.compile(r"^\s*(?:[>|#]|[-*+]\s|\d+[.)]\s|```|~~~)")
_ENVELOPE = re.compile(r'\A<data source="[^"]*" trust="untrusted">\n(.*)\n</data>\Z', re.DOTALL)
_HEAD_LINES = 12
_MAX_CHARS = 1500
_TABLE_ROWS = 20


def _echo(text: str, then: str) -> str:
    """``You said: "<text>". <then>``; text with Markdown blocks (a table, a quote, a list) or quotes stays a block."""
    if "\n" in text.strip() or '"' in text or _BLOCK.match(text):
        return f"You said:\n\n{text.strip()}\n\n{then}"
    return f'You said: "{text}". {then}'


def _unwrapped(content: str) -> str:
    """A tool result without the data envelope the runtime puts around untrusted content."""
    found = _ENVELOPE.match(content)
    return found.group(1) if found else content


def _arguments(request: ModelRequest, result: ChatMessage) -> dict[str, Any]:
    """The arguments of the call ``result`` answers (from the assistant message that made it)."""
    for message in reversed(request.messages):
        for call in message.tool_calls:
            if call.id == result.tool_call_id:
                return call.arguments
    return {}


def _head_tail(text: str) -> str:
    """``text``, or its first and last lines around a note of how many were left out."""
    lines = text.splitlines()
    if len(lines) > 2 * _HEAD_LINES:
        omitted = len(lines) - 2 * _HEAD_LINES
        text = "\n".join([*lines[:_HEAD_LINES], f"… {omitted} lines omitted …", *lines[-_HEAD_LINES:]])
    if len(text) > _MAX_CHARS:
        half = _MAX_CHARS // 2
        text = f"{text[:half]}\n… {len(text) - 2 * half} characters omitted …\n{text[-half:]}"
    return text


def _fenced(text: str) -> str:
    """``text`` as a fenced code block whose fence no line of it closes."""
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text.rstrip()}\n{fence}"


def _code(text: str) -> str:
    """``text`` as inline code on one line."""
    line = " ".join(str(text).split())
    tick = "``" if "`" in line else "`"
    return f"{tick} {line} {tick}" if tick == "``" else f"`{line}`"


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _shell(value: dict[str, Any], commands: Any) -> str:
    """Each command with its exit status, then its output and errors (head and tail when long)."""
    outputs = [entry for entry in value["output"] if isinstance(entry, dict)]
    listed = commands if isinstance(commands, list) else []
    where = f" in the {value['isolation']} sandbox" if value.get("isolation") else ""
    parts = [f"Ran {len(outputs)} command{'s' if len(outputs) != 1 else ''}{where}."]
    for index, entry in enumerate(outputs):
        command = listed[index] if index < len(listed) else f"command {index + 1}"
        found = entry.get("outcome")
        outcome: dict[str, Any] = found if isinstance(found, dict) else {}
        status = "timed out" if outcome.get("type") == "timeout" else f"exit {outcome.get('exit_code', '?')}"
        parts.append(f"**{index + 1}.** {_code(command)} — {status}")
        stdout, stderr = str(entry.get("stdout") or ""), str(entry.get("stderr") or "")
        if stdout.strip():
            parts.append(_fenced(_head_tail(stdout)))
        if stderr.strip():
            parts.append("stderr:\n" + _fenced(_head_tail(stderr)))
        if not stdout.strip() and not stderr.strip():
            parts.append("(no output)")
    if value.get("error"):
        parts.append(f"Note: {value['error']}")
    return "\n\n".join(parts)


def _cell(value: Any) -> str:
    return _short("NULL" if value is None else value, 60).replace("|", "\\|").replace("\n", " ")


def _sql(value: dict[str, Any]) -> str | None:
    """Rows as a Markdown table; a write as how many rows it changed."""
    if value.get("statement") == "write":
        return f"{value.get('changed_rows', 0)} row(s) changed."
    columns, rows = value.get("columns"), value.get("rows")
    if not isinstance(columns, list) or not isinstance(rows, list):
        return None
    if not rows:
        return "no rows."
    lines = [
        "| " + " | ".join(_cell(c) for c in columns) + " |",
        "|" + " --- |" * len(columns),
        *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows[:_TABLE_ROWS] if isinstance(row, list)),
    ]
    count = value.get("row_count", len(rows))
    more = f" ({len(rows) - _TABLE_ROWS} more not shown)" if len(rows) > _TABLE_ROWS else ""
    return f"{count} row(s){more}:\n\n" + "\n".join(lines) + (f"\n\n{value['more']}" if value.get("more") else "")


def _sent(value: dict[str, Any]) -> str | None:
    return f"sent {_code(value['sent'])} ({value.get('bytes', '?')} bytes)." if "sent" in value else None


def _written(value: dict[str, Any]) -> str | None:
    if "path" not in value or "bytes" not in value:
        return None
    verb = "appended to" if value.get("appended") else "wrote"
    return f"{verb} {_code(value['path'])} ({value['bytes']} bytes)."


def _read(value: dict[str, Any]) -> str | None:
    if "content" not in value:
        return None
    return f"{_code(value.get('path', 'the file'))}:\n\n{_fenced(_head_tail(str(value['content'])))}"


def _listed(value: dict[str, Any]) -> str | None:
    entries = value.get("entries")
    if not isinstance(entries, list):
        return None
    if not entries:
        return f"{_code(value.get('path', '.'))} is empty."
    lines = []
    for entry in entries[:_TABLE_ROWS]:
        if isinstance(entry, dict):
            size = f" ({entry['bytes']} bytes)" if "bytes" in entry else ""
            lines.append(f"- {_code(entry.get('path', '?'))} {entry.get('type', '')}{size}".rstrip())
    more = f"\n- … {len(entries) - _TABLE_ROWS} more" if len(entries) > _TABLE_ROWS else ""
    return f"{_code(value.get('path', '.'))} holds {len(entries)} entries:\n\n" + "\n".join(lines) + more


def _skill(value: dict[str, Any]) -> str | None:
    if "skill" not in value:
        return None
    where = _code(value.get("path", ""))
    return f"loaded the skill {_code(value['skill'])} (version {value.get('version', '?')}) into {where}."


_SUMMARIES: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "sql": _sql,
    "send_file": _sent,
    "write_file": _written,
    "read_file": _read,
    "list_files": _listed,
    "use_skill": _skill,
}
"""Readable summaries of known tools' results (``None``: a shape the summary does not know, shown generically)."""


def _summary(name: str, value: dict[str, Any]) -> str:
    """Any other result: its fields, one short line each."""
    items = list(value.items())
    lines = [f"- {key}: {_short(item)}" for key, item in items[:10]]
    if len(items) > 10:
        lines.append(f"- … {len(items) - 10} more fields")
    return f"{name} returned:\n\n" + "\n".join(lines) if lines else f"{name} returned nothing."
