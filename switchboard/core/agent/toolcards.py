"""The user's view of a turn's tool calls: one ``ShowToolCall`` as a call starts, one as it ends.

Only what is safe to show leaves here: the arguments as a short preview with secret-looking values redacted, and the
output as its head and tail (a shell call's commands' stdout and stderr, with their exit status).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import PurePosixPath
from typing import Any, Final

from switchboard.core.actions import ShowToolCall, ToolFile, ToolState
from switchboard.core.model import ToolCall
from switchboard.core.tools.calls import ToolOutcome
from switchboard.core.tools.gateway import canonical_json

__all__ = [
    "HEAD_CHARS",
    "HEAD_LINES",
    "TITLE_CHARS",
    "arguments_preview",
    "ended",
    "outcome_card",
    "output_parts",
    "started",
    "title_of",
]

TITLE_CHARS: Final = 120
ARGUMENTS_CHARS: Final = 500
HEAD_LINES: Final = 20
"""Lines the head (and the tail) of an output shows at most."""
HEAD_CHARS: Final = 2000
"""Characters the head (and the tail) of an output shows at most."""
REDACTED: Final = "[redacted]"
_SECRET_WORDS: Final = (
    r"token|secret|passw|passphrase|api[_-]?key|access[_-]?key|auth(?!or)|credential|cookie|private[_-]?key|bearer|jwt"  # noqa: S105
)
_SECRET_KEY = re.compile(_SECRET_WORDS, re.I)
_SECRET_IN_TEXT: Final = (
    re.compile(r"(?i)(\b(?:proxy-)?authorization\s*:\s*)(?:(?:bearer|basic|token|digest)\s+)?[^\s'\"]+"),
    re.compile(r"(?i)(\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(rf"(?i)((?<![\w{{-])[\w-]*(?:{_SECRET_WORDS})[\w-]*\s*[:=]\s*['\"]?)(?!\{{\{{)[^\s'\"&,;}}]+"),
    re.compile(
        r"()\b(?:sk-[\w-]{16,}|sk_(?:live|test)_\w{16,}|gh[pousr]_\w{20,}|github_pat_\w{20,}|xox[abposr]-[\w-]{10,}"
        r"|A[KS]IA[0-9A-Z]{16}|AIza[\w-]{35}|glpat-[\w-]{20,}|hf_\w{30,}|eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,})"
    ),
)
"""Credentials inside a string: an ``Authorization`` header, a ``Bearer``/``Basic`` credential, ``key=value`` under a
secret-looking name, and well-known token shapes (the first group, kept, is what names it)."""
_MAIN_ARGUMENT = ("command", "commands", "code", "path", "query", "url", "question", "name", "text")


def _one_line(text: str, limit: int) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def title_of(call: ToolCall) -> str:
    """The tool and its main argument on one line (a program: its first code line)."""
    args = call.arguments
    main: Any = next((args[key] for key in _MAIN_ARGUMENT if key in args), None)
    if main is None:
        main = next(
            (value for key, value in args.items() if isinstance(value, str) and not _SECRET_KEY.search(key)), ""
        )
    if isinstance(main, list):
        main = " ; ".join(str(item) for item in main)
    shown = _one_line(_scrubbed(_one_line(str(main), 2 * TITLE_CHARS)), TITLE_CHARS)
    return _one_line(f"{call.name}: {shown}" if shown else call.name, TITLE_CHARS)


def _scrubbed(text: str) -> str:
    """``text`` with the credentials in it (:data:`_SECRET_IN_TEXT`) replaced by :data:`REDACTED`.

    Only as much as a card shows is scanned (the patterns are not linear in a long run of word characters).
    """
    text = text if len(text) <= ARGUMENTS_CHARS else text[:ARGUMENTS_CHARS] + "…"
    for pattern in _SECRET_IN_TEXT:
        text = pattern.sub(lambda match: match.group(1) + REDACTED, text)
    return text


def _secret_name(value: Any) -> bool:
    return isinstance(value, str) and bool(_SECRET_KEY.search(value))


def _redacted(value: Any) -> Any:
    """``value`` with what is under secret-looking keys at any depth, and credentials in strings, redacted.

    A header given as a ``[name, value]`` pair or a ``{"name": …, "value": …}`` object counts as keyed by its name.
    """
    if isinstance(value, dict):
        if _secret_name(value.get("name")) and "value" in value:
            value = {**value, "value": REDACTED}
        return {k: REDACTED if _SECRET_KEY.search(str(k)) else _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) == 2 and _secret_name(value[0]):
            return [value[0], REDACTED]
        return [_redacted(item) for item in value]
    if isinstance(value, str):
        return _scrubbed(value)
    return value


def arguments_preview(arguments: dict[str, Any]) -> str:
    """The arguments as JSON, values under secret-looking keys redacted, at most 500 characters."""
    text = canonical_json(_redacted(arguments))
    return text if len(text) <= ARGUMENTS_CHARS else text[: ARGUMENTS_CHARS - 1] + "…"


def output_parts(text: str) -> tuple[str, str, int]:
    """``(head, tail, omitted lines)`` of an output: each at most :data:`HEAD_LINES` lines and :data:`HEAD_CHARS`.

    A line cut to fit is marked ``…`` where it was cut, so a cut part never passes for the whole output.
    """
    lines = text.splitlines()
    if len(lines) <= HEAD_LINES and len(text) <= HEAD_CHARS:
        return text, "", 0
    head = "\n".join(lines[:HEAD_LINES])
    head = head if len(head) <= HEAD_CHARS else head[: HEAD_CHARS - 1] + "…"
    shown = head.count("\n") + 1
    rest = lines[shown:]
    tail = "\n".join(rest[-HEAD_LINES:])
    tail = tail if len(tail) <= HEAD_CHARS else "…" + tail[-(HEAD_CHARS - 1) :]
    kept = tail.count("\n") + 1 if tail else 0
    return head, tail, max(0, len(rest) - kept)


def started(call: ToolCall, reply_to: str | None) -> ShowToolCall:
    """The card of a call that starts now."""
    return ShowToolCall(
        reply_to=reply_to,
        call_id=call.id,
        tool=call.name,
        title=title_of(call),
        arguments=arguments_preview(call.arguments),
        state="running",
        started_at=time.time(),
    )


def ended(
    card: ShowToolCall,
    state: ToolState,
    output: str,
    *,
    exit_status: int | None = None,
    files: tuple[ToolFile, ...] = (),
    duration_ms: float | None = None,
) -> ShowToolCall:
    """The card of ``card``'s call, ended in ``state`` with ``output``."""
    head, tail, omitted = output_parts(output)
    took = duration_ms if duration_ms is not None else (time.time() - card.started_at) * 1000
    return card.model_copy(
        update={
            "state": state,
            "duration_ms": round(took, 3),
            "exit_status": exit_status,
            "output_head": head,
            "output_tail": tail,
            "omitted_lines": omitted,
            "files": files,
        }
    )


def _shell_view(value: dict[str, Any]) -> tuple[str, int | None]:
    """A shell result's stdout and stderr (each command's, in order) and the first failing exit status (else 0)."""
    parts: list[str] = []
    status: int | None = 0
    for entry in value.get("output") or ():
        if not isinstance(entry, dict):
            continue
        parts += [str(entry[name]) for name in ("stdout", "stderr") if entry.get(name)]
        outcome = entry.get("outcome") or {}
        if outcome.get("type") == "timeout":
            parts.append("(timed out)")
            status = status if status else None
        elif isinstance(code := outcome.get("exit_code"), int) and code != 0 and status == 0:
            status = code
    if value.get("error"):
        parts.append(str(value["error"]))
    return "\n".join(part.rstrip("\n") for part in parts), status


def _files(outcome: ToolOutcome, writes: bool) -> tuple[ToolFile, ...]:
    value = outcome.value if isinstance(outcome.value, dict) else {}
    found = [value.get("sent")] + ([value.get("path")] if writes else [])
    return tuple(ToolFile(name=PurePosixPath(p).name, path=p) for p in found if isinstance(p, str) and p)


def outcome_card(card: ShowToolCall, outcome: ToolOutcome, *, writes: bool) -> ShowToolCall:
    """The card of a call through the gateway, from its real outcome (``writes``: the tool's side effect)."""
    if outcome.approval is not None:
        return ended(card, "waiting_approval", outcome.approval.reason, duration_ms=outcome.duration_ms)
    if not outcome.ok:
        refused = (outcome.policy or "").startswith("refuse:") or outcome.attempts == 0
        state: ToolState = "refused" if refused and outcome.error_class != "validation" else "failed"
        return ended(card, state, outcome.error or outcome.error_class or "failed", duration_ms=outcome.duration_ms)
    exit_status: int | None = None
    if outcome.tool == "shell" and isinstance(outcome.value, dict) and "output" in outcome.value:
        text, exit_status = _shell_view(outcome.value)
        state = "ok" if exit_status == 0 else "failed"
    else:
        text = outcome.for_model()
        state = "ok"
    files = _files(outcome, writes)
    return ended(card, state, text, exit_status=exit_status, files=files, duration_ms=outcome.duration_ms)


def program_output(content: str) -> str:
    """What a CodeAct program printed, then its error or its value: the program result a person reads."""
    try:
        body = json.loads(content)
    except ValueError:
        return content
    if not isinstance(body, dict) or "output" not in body:
        return content
    parts = [str(body.get("output") or "").rstrip("\n")]
    if body.get("error"):
        parts.append(f"error: {body['error']}")
    elif body.get("value") is not None:
        parts.append(f"→ {json.dumps(body['value'], ensure_ascii=False)}")
    return "\n".join(part for part in parts if part)
