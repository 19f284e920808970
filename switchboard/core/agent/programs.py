"""④ What a CodeAct program is and leaves behind: its limits, its result, and a paused program's envelope.

:mod:`switchboard.core.agent.codeact` runs programs; this module holds the plain data it exchanges with the
runtime, the conversion of values into and out of the sandbox, and :func:`cap_output`, the head-and-tail
cap the tool gateway also applies to large text.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any, Literal

import pydantic_monty as monty
from pydantic import BaseModel, ConfigDict, ValidationError

from switchboard.errors import AgentError

__all__ = [
    "MONTY_VERSION",
    "SNAPSHOT_SCHEMA",
    "CappedOutput",
    "PausedProgram",
    "ProgramLimits",
    "ProgramResult",
    "ProgramSnapshotError",
    "cap_output",
    "from_sandbox",
    "to_sandbox",
]

logger = logging.getLogger(__name__)

MONTY_VERSION: str = monty.__version__
"""Snapshots are only resumed under the Monty version that made them."""
SNAPSHOT_SCHEMA = "switchboard.codeact.paused/1"


class ProgramSnapshotError(AgentError):
    """A paused program cannot be resumed: corrupt, tampered with, or from another Monty version."""


@dataclass(frozen=True)
class ProgramLimits:
    """What one program may use; time and memory are enforced inside Monty."""

    max_duration_s: float = 5.0
    """Interpreter time (time spent waiting for tools does not count: tools have their own timeouts)."""
    max_memory_bytes: int = 64 * 2**20
    max_output_chars: int = 8000
    """Printed output kept (head and tail, with an omission marker between)."""
    max_calls: int = 50
    """Tool calls one program may make."""

    def __post_init__(self) -> None:
        if self.max_duration_s <= 0 or self.max_memory_bytes <= 0 or self.max_output_chars <= 0 or self.max_calls < 0:
            raise ValueError(f"program limits must be positive: {self}")

    def as_monty(self) -> monty.ResourceLimits:
        """The limits in Monty's terms."""
        return {
            "max_feed_duration_secs": self.max_duration_s,
            "max_memory": self.max_memory_bytes,
            # name lookups and OS calls suspend too; this is only a backstop behind ``max_calls``
            "max_suspensions": self.max_calls * 4 + 64,
        }


@dataclass(frozen=True)
class ProgramResult:
    """How a program ended: its printed output, its last expression's value, or an error (or a pause)."""

    output: str
    value: Any
    error: str | None
    calls: int
    """Tool calls made (on a resumed program: including those before the pause and the paused one)."""
    paused: PausedProgram | None = None


def cap_output(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and tail around ``… [N chars omitted] …``.

    The result never exceeds ``limit`` (for limits of a few dozen characters and more).
    """
    return _render(text[:limit], text[-limit:] if limit > 0 else "", len(text), limit)


def _render(head: str, tail: str, total: int, limit: int) -> str:
    if total <= limit:
        return head
    marker = f"\n… [{total} chars omitted] …\n"
    room = max(limit - len(marker), 0)
    if room < 16:
        return head[:limit]
    keep_head = room // 2
    keep_tail = room - keep_head
    marker = f"\n… [{total - keep_head - keep_tail} chars omitted] …\n"
    return head[:keep_head] + marker + (tail[-keep_tail:] if keep_tail else "")


@dataclass
class CappedOutput:
    """Printed output as it streams in, kept as its first and last ``limit`` characters (bounded memory)."""

    limit: int
    head: str = ""
    tail: str = ""
    total: int = 0

    def write(self, _stream: str, text: str) -> None:
        """Take one piece of output (the signature of Monty's print callback)."""
        self.total += len(text)
        if len(self.head) < self.limit:
            self.head += text[: self.limit - len(self.head)]
        self.tail = (self.tail + text)[-self.limit :]

    def render(self) -> str:
        """The output so far, capped as :func:`cap_output` caps text."""
        return _render(self.head, self.tail, self.total, self.limit)


class _Envelope(BaseModel):
    """The serialised form of a paused program (schema-validated; never pickled)."""

    model_config = ConfigDict(extra="forbid")

    schema_: Literal["switchboard.codeact.paused/1"]
    monty_version: str
    snapshot: str
    snapshot_sha256: str
    tool: str
    args: dict[str, Any]
    calls: int
    output: dict[str, Any]
    limits: dict[str, Any]
    tool_names: list[str] | None
    tool_params: dict[str, list[str]]
    mac: str | None = None


@dataclass(frozen=True)
class PausedProgram:
    """A program stopped at a tool call, waiting for that call's result (an approval, usually)."""

    snapshot: bytes
    """Monty's dump of the suspended interpreter."""
    tool: str
    args: dict[str, Any]
    """The pending call's arguments (keyword form, JSON-shaped)."""
    calls: int
    """Tool calls completed before the pause."""
    limits: ProgramLimits
    tool_names: tuple[str, ...] | None
    tool_params: Mapping[str, Sequence[str]] = field(default_factory=dict)
    output: tuple[str, str, int] = ("", "", 0)
    """Printed output so far, as (head, tail, total chars)."""
    monty_version: str = MONTY_VERSION

    def dump(self, *, key: bytes | None = None) -> bytes:
        """A JSON envelope (schema ``switchboard.codeact.paused/1``); with ``key``, HMAC-SHA256 signed."""
        head, tail, total = self.output
        body: dict[str, Any] = {
            "schema": SNAPSHOT_SCHEMA,
            "monty_version": self.monty_version,
            "snapshot": base64.b64encode(self.snapshot).decode("ascii"),
            "snapshot_sha256": hashlib.sha256(self.snapshot).hexdigest(),
            "tool": self.tool,
            "args": self.args,
            "calls": self.calls,
            "output": {"head": head, "tail": tail, "total": total},
            "limits": asdict(self.limits),
            "tool_names": list(self.tool_names) if self.tool_names is not None else None,
            "tool_params": {name: list(params) for name, params in self.tool_params.items()},
        }
        if key is not None:
            body["mac"] = _mac(key, body)
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def load(cls, data: bytes, *, key: bytes | None = None) -> PausedProgram:
        """Read an envelope made by :meth:`dump`; with ``key``, its signature must verify.

        Raises:
            ProgramSnapshotError: the envelope is malformed, altered, unsigned when a key is given, or
                was made by another Monty version.
        """
        try:
            raw = json.loads(data)
            env = _Envelope.model_validate({("schema_" if k == "schema" else k): v for k, v in raw.items()})
            snapshot = base64.b64decode(env.snapshot, validate=True)
            limits = ProgramLimits(**env.limits)
            output = (str(env.output["head"]), str(env.output["tail"]), int(env.output["total"]))
        except (ValueError, TypeError, KeyError, AttributeError, ValidationError) as exc:
            raise ProgramSnapshotError(f"not a paused program envelope ({SNAPSHOT_SCHEMA}): {exc}") from None
        if key is not None:
            body = {k: v for k, v in raw.items() if k != "mac"}
            if env.mac is None or not hmac.compare_digest(env.mac.encode(), _mac(key, body).encode()):
                raise ProgramSnapshotError("the paused program's signature does not verify: refusing to resume it")
        if not hmac.compare_digest(hashlib.sha256(snapshot).hexdigest().encode(), env.snapshot_sha256.encode()):
            raise ProgramSnapshotError("the paused program's snapshot is corrupt (sha256 mismatch)")
        if env.monty_version != MONTY_VERSION:
            raise ProgramSnapshotError(
                f"the program was paused under Monty {env.monty_version} but this process runs Monty "
                f"{MONTY_VERSION}: resume it on a worker with Monty {env.monty_version}, or discard it"
            )
        return cls(
            snapshot=snapshot,
            tool=env.tool,
            args=env.args,
            calls=env.calls,
            limits=limits,
            tool_names=tuple(env.tool_names) if env.tool_names is not None else None,
            tool_params=env.tool_params,
            output=output,
            monty_version=env.monty_version,
        )


def _mac(key: bytes, body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def to_sandbox(value: Any, depth: int = 0) -> Any:
    """A tool result or input as Monty can hold it: JSON-shaped data, dates and bytes."""
    if value is None or isinstance(value, bool | int | float | str | bytes | dt.date | dt.time | dt.timedelta):
        return value
    if depth > 64:
        return repr(value)
    if isinstance(value, BaseModel):
        return to_sandbox(value.model_dump(mode="json"), depth + 1)
    if isinstance(value, Mapping):
        return {str(k): to_sandbox(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_sandbox(v, depth + 1) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    return str(value)


def from_sandbox(value: Any, depth: int = 0) -> Any:
    """A value out of the sandbox as JSON-shaped data (tuples become lists, objects their repr)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if depth > 64:
        return "…"
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: from_sandbox(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [from_sandbox(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((from_sandbox(v, depth + 1) for v in value), key=repr)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, monty.MontyClassProxy):
        return {"class": value.name, **{str(k): from_sandbox(v, depth + 1) for k, v in value.attributes.items()}}
    return repr(value)
