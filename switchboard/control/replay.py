"""A replay case of a real session: its turns as an evaluation scenario (``switchboard eval record``, the console).

Read from what the session stores anyway: the history (the user's words, the model's tool calls, the tools' results,
the answers) and the event log (which messages operators sent, which calls asked for approval). Each turn becomes one
user message of the scenario; the model's decisions become scripted steps; each tool's results become a fake tool's
``responses`` in call order. Nothing but this one session's keys is read, so the case holds no more than the session
did. Default invariants pin what happened, for the operator to edit into the regression they want.
The result is plain data in the scenario file format (``docs/evals.md``); :mod:`switchboard.evals.record` validates it.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from switchboard.control.scope import NotFoundError, session_parts
from switchboard.control.transcript import OPERATOR_PREFIX
from switchboard.control.views import TimelineEntry
from switchboard.core.turn import HistoryEntry

__all__ = ["ERROR_CLASSES", "build_case", "case_yaml"]

ERROR_CLASSES: Final = frozenset({"validation", "auth", "rate_limit", "transient", "ambiguous_timeout", "permanent"})
"""The failure classes a scenario's fake tool can replay (others are recorded as ``permanent``)."""
_ENVELOPE: Final = re.compile(r'\A<data source="[^"]*" trust="untrusted">\n(.*)\n</data>\Z', re.DOTALL)
_ANSWER_CHARS: Final = 200


@dataclass
class _Turn:
    texts: list[str] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    results: list[tuple[str, dict[str, Any], HistoryEntry]] = field(default_factory=list)
    """``(tool, call arguments, tool entry)`` of each call that ran through the tool gateway, in call order."""
    answer: str = ""


def _result_of(entry: HistoryEntry) -> dict[str, Any]:
    """A tool entry as a fake tool's response: the value it returned (out of its data envelope), or its failure."""
    text = entry.text
    inside = _ENVELOPE.match(text)
    if inside is not None:
        text = inside.group(1)
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = text
    if entry.meta.get("ok") is False:
        failure = value if isinstance(value, dict) else {}
        error = failure.get("error") if isinstance(failure.get("error"), str) else text
        error_class = failure.get("error_class")
        return {"error": error, "error_class": error_class if error_class in ERROR_CLASSES else "permanent"}
    return {"result": value}


def _turns(history: Sequence[HistoryEntry], operators: frozenset[str]) -> list[_Turn]:
    """The history's turns that answered a user (an operator's line, or a turn without a user's words, is left out)."""
    turns: list[_Turn] = []
    now = _Turn()
    names: dict[str, tuple[str, dict[str, Any]]] = {}
    for entry in history:
        if entry.role == "user":
            if now.steps:  # a turn that never answered (stopped, failed): start over from this message
                now = _Turn()
            now.texts.append(entry.text)
            now.message_ids.append(entry.message_id or "")
        elif entry.role == "tool":
            call_id = str(entry.meta.get("call_id", ""))
            if "ok" in entry.meta and call_id in names:  # it ran through the gateway (a refusal did not)
                tool, arguments = names[call_id]
                now.results.append((tool, arguments, entry))
        elif entry.meta.get("tool_calls"):
            calls = []
            for call in entry.meta["tool_calls"]:
                arguments = call.get("arguments") if isinstance(call.get("arguments"), dict) else {}
                names[str(call.get("id", ""))] = (str(call.get("name", "")), arguments)
                calls.append({"tool": str(call.get("name", "")), "arguments": arguments})
            now.steps.append({"calls": calls})
        elif (entry.message_id or "") in operators:
            continue  # an operator's words to the user: not the model's
        else:
            now.answer = entry.text
            now.steps.append({"answer": entry.text} if entry.text.strip() else {})
            if now.texts:
                turns.append(now)
            now = _Turn()
    return turns


def _fake_tools(turns: Sequence[_Turn]) -> list[dict[str, Any]]:
    tools: dict[str, dict[str, Any]] = {}
    for turn in turns:
        for tool, _, entry in turn.results:
            spec = tools.setdefault(
                tool,
                {
                    "name": tool,
                    "description": f"{tool}, answering as it did in the recorded session.",
                    "side_effect": "write" if entry.meta.get("side_effect") == "write" else "read",
                    "untrusted": entry.meta.get("trust") == "data",
                    "responses": [],
                },
            )
            spec["responses"].append(_result_of(entry))
    return list(tools.values())


def _invariants(turns: Sequence[_Turn], tenant: str, others: Sequence[str]) -> list[dict[str, Any]]:
    """What held in the recorded session, as checks: a replay passes them all until the operator edits them."""
    calls = [(c["tool"], c["arguments"]) for t in turns for s in t.steps for c in s.get("calls", [])]
    ran = [(tool, arguments, entry) for t in turns for tool, arguments, entry in t.results]
    invariants: list[dict[str, Any]] = []
    first: dict[str, dict[str, Any]] = {}
    for tool, arguments in calls:
        first.setdefault(tool, arguments)
    invariants += [{"check": "tool_used", "tool": tool, "arguments": arguments} for tool, arguments in first.items()]
    writes = [(tool, arguments) for tool, arguments, e in ran if e.meta.get("side_effect") == "write" and e.meta["ok"]]
    allowed = sorted({tool for tool, _ in writes})
    invariants.append({"check": "no_unapproved_write", "allowed": allowed, "strict": True})
    keys = [tool + json.dumps(arguments, sort_keys=True) for tool, arguments in writes]
    if len(keys) == len(set(keys)):
        invariants.append({"check": "no_repeated_write", "strict": True})
    seen = json.dumps([[t.texts, t.steps] for t in turns]) + json.dumps(_fake_tools(turns))
    markers = sorted({o for o in others if o and o != tenant and o not in seen})
    if markers:
        invariants.append({"check": "tenant_kept", "others": markers, "strict": True})
    steps = sum(len(t.steps) for t in turns)
    invariants.append({"check": "budget_respected", "max_steps": steps, "max_tool_calls": len(calls)})
    answer = turns[-1].answer.strip()
    if answer:
        invariants.append({"check": "answer_contains", "text": answer[:_ANSWER_CHARS]})
    return invariants


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", text.lower()).strip("-.")[:40] or "agent"


def build_case(
    session: str,
    history: Sequence[HistoryEntry],
    events: Sequence[TimelineEntry],
    *,
    run_id: str | None = None,
    others: Sequence[str] = (),
    recorded_at: float | None = None,
) -> dict[str, Any]:
    """The scenario (plain data) that replays ``session``'s turns, up to the one of ``run_id`` when given.

    ``others`` are other tenants' names: those that the session never mentions become a ``tenant_kept`` check.

    Raises:
        NotFoundError: the session holds no answered turn (or none of ``run_id``).
    """
    tenant, agent, channel = session_parts(session)[:3]
    operators = frozenset(
        str(e.data.get("message_id"))
        for e in events
        if e.kind == "message_received" and str(e.data.get("sender", "")).startswith(OPERATOR_PREFIX)
    )
    turns = _turns(history, operators)
    if run_id is not None:
        index = next((i for i, t in enumerate(turns) if run_id in {f"run-{m}" for m in t.message_ids}), None)
        if index is None:
            raise NotFoundError(f"session {session[:200]} has no answered run {run_id[:80]!r} in its history")
        turns = turns[: index + 1]
    if not turns:
        raise NotFoundError(f"session {session[:200]} has no answered turn in its history to record")
    digest = hashlib.sha256(f"{session}|{turns[-1].message_ids[0]}".encode()).hexdigest()[:10]
    at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(recorded_at if recorded_at is not None else time.time()))
    approvals = sorted(
        {str(e.data.get("tool")) for e in events if e.kind == "approval_requested" and e.data.get("tool")}
    )
    asked = f" Approvals were asked for: {', '.join(approvals)}." if approvals else ""
    return {
        "id": f"replay-{_slug(agent)}-{digest}",
        "version": "1",
        "description": (
            f"Replay of session {session}, {len(turns)} turn(s) up to run-{turns[-1].message_ids[0]}, recorded "
            f"{at} by `switchboard eval record`: the model's decisions and the tools' results as they were.{asked} "
            "Edit the invariants into what must hold."
        ),
        "channel": channel,
        "tenant": tenant,
        "messages": ["\n".join(t.texts) for t in turns],
        "agent": {"configured": agent},
        "model": [step for t in turns for step in t.steps],
        "tools": _fake_tools(turns),
        "invariants": _invariants(turns, tenant, others),
    }


def case_yaml(case: Mapping[str, Any]) -> str:
    """``case`` as a scenario file's text, which loads back as ``case`` exactly.

    Unicode is written as is where that reads back the same; some characters (``U+0085``, a line break to YAML) do
    not, and then every non-ASCII character is written escaped.
    """
    head = "# Recorded by `switchboard eval record` (docs/evals.md). Run it: switchboard eval run <this file>\n"
    text = yaml.safe_dump(dict(case), sort_keys=False, allow_unicode=True, width=120)
    if yaml.safe_load(text) != case:
        text = yaml.safe_dump(dict(case), sort_keys=False, allow_unicode=False, width=120)
    return head + text
