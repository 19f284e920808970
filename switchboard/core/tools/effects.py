"""Effects of write tools: idempotency records, and the interim gate on effects after untrusted content.

A write's key is ``sha256(run_id, tool, key arguments, occurrence)``, so a deliberate repeat runs while a re-attempt
of the run finds each earlier call's record; a record still ``started`` is never re-run blindly but routed to
reconciliation (``docs/ARCHITECTURE.md`` §6). :class:`TurnEffects` keeps the records for one turn when no Redis
store is wired (tests, one-off runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "EFFECT_TTL_S",
    "EffectRecord",
    "EffectStore",
    "EffectTool",
    "Refused",
    "TurnEffects",
    "claim_effect",
    "doubt_effect",
    "effect_key",
    "logical_action",
    "running",
    "running_here",
    "settle_effect",
]

EFFECT_TTL_S = 8 * 24 * 3600
"""How long an effect record is kept: longer than any retry of the turn (platform retries stop after 24 h)."""


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """What the store keeps under one idempotency key."""

    action_sha256: str
    """Hash of the tool name and its full normalised arguments."""
    status: Literal["started", "done"] = "started"
    outcome: dict[str, Any] | None = None
    """The recorded outcome (``ToolOutcome`` as JSON), once ``done``."""
    tool: str = ""
    """The tool (empty in records written before it was kept)."""
    run_id: str = ""
    """The run that claimed the key."""
    started_at: float = 0.0
    """Unix time of the claim (``0``: unknown)."""

    def to_json(self) -> str:
        """Compact JSON, as stored."""
        body = {
            "action_sha256": self.action_sha256,
            "status": self.status,
            "outcome": self.outcome,
            "tool": self.tool,
            "run_id": self.run_id,
            "started_at": self.started_at,
        }
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str)

    @classmethod
    def from_json(cls, raw: str | bytes) -> EffectRecord:
        """Read a stored record (records written before ``tool``, ``run_id`` and ``started_at`` read as unknown)."""
        body = json.loads(raw)
        outcome = body.get("outcome")
        done = body.get("status") == "done"
        started_at = body.get("started_at")
        return cls(
            str(body["action_sha256"]),
            "done" if done else "started",
            outcome if isinstance(outcome, dict) else None,
            tool=str(body.get("tool") or ""),
            run_id=str(body.get("run_id") or ""),
            started_at=float(started_at) if isinstance(started_at, int | float) else 0.0,
        )


class EffectTool(Protocol):
    """What effect records read of a tool (a :class:`~switchboard.core.tools.definition.Tool`)."""

    @property
    def name(self) -> str:
        """The tool's name, kept on its records."""

    @property
    def side_effect(self) -> Literal["read", "write"]:
        """Only writes are claimed."""

    @property
    def key_fields(self) -> tuple[str, ...]:
        """Arguments naming the logical action; empty: all."""

    @property
    def timeout_s(self) -> float:
        """How long a sibling's claim of the same action is awaited."""

    @property
    def idempotent(self) -> bool:
        """The downstream honours the key: a claim left ``started`` may be run again under it."""


@runtime_checkable
class EffectStore(Protocol):
    """Idempotency records of write effects (implemented in Redis by the queue layer, fenced by the lease)."""

    async def effect_begin(self, key: str, record: EffectRecord) -> EffectRecord | None:
        """Claim ``key`` with ``record``; returns the existing record instead when there is one."""

    async def effect_finish(self, key: str, record: EffectRecord | None) -> None:
        """Store the finished ``record`` under ``key``, or release the claim (``None``) after a failure."""

    async def effect_doubt(self, key: str, record: EffectRecord, info: Mapping[str, str]) -> None:
        """Route the claim ``record`` of ``key``, whose outcome is unknown, to reconciliation (idempotent).

        ``info`` says where it happened and why it is in doubt (``session``, ``tenant``, ``agent``, ``run_id``,
        ``actor``, ``reason``: ``found_started`` or ``ambiguous_timeout``); never arguments.
        """


class TurnEffects:
    """An :class:`EffectStore` in memory, for a turn run without the queue's store."""

    def __init__(self) -> None:
        self.records: dict[str, EffectRecord] = {}
        self.doubts: dict[str, tuple[EffectRecord, dict[str, str]]] = {}
        """Effects in doubt by key, as reconciliation would list them."""

    async def effect_begin(self, key: str, record: EffectRecord) -> EffectRecord | None:
        """Claim ``key`` with ``record``; returns the existing record instead when there is one."""
        found = self.records.get(key)
        if found is None:
            self.records[key] = record
        return found

    async def effect_finish(self, key: str, record: EffectRecord | None) -> None:
        """Store the finished ``record`` under ``key``, or release the claim (``None``) after a failure."""
        if record is None:
            self.records.pop(key, None)
        else:
            self.records[key] = record

    async def effect_doubt(self, key: str, record: EffectRecord, info: Mapping[str, str]) -> None:
        """Route the claim ``record`` of ``key``, whose outcome is unknown, to reconciliation (idempotent)."""
        self.doubts[key] = (record, dict(info))


def logical_action(tool: EffectTool, normalised: dict[str, Any]) -> dict[str, Any]:
    """The arguments that name the action: the tool's ``key_fields``, or all of them."""
    if not tool.key_fields:
        return normalised
    return {name: normalised.get(name) for name in tool.key_fields}


def effect_key(run_id: str, tool: str, logical: dict[str, Any], occurrence: int = 1) -> str:
    """``sha256(run_id, tool, canonical logical arguments, occurrence)``: one key per logical action of a run.

    Args:
        run_id: the run (the same for every attempt at it).
        tool: the tool's name.
        logical: the arguments naming the action (:func:`logical_action`).
        occurrence: 1 for the first such action of the run, n for the n-th; the first keeps the key it had
            before occurrences were counted, so records written then are still found.

    Raises:
        ValueError: ``occurrence`` is below 1.
    """
    if occurrence < 1:
        raise ValueError(f"occurrence counts from 1, not {occurrence}")
    canonical = json.dumps(logical, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    tail = "" if occurrence == 1 else f"\n{occurrence}"  # compact JSON has no raw newline: no collision
    return hashlib.sha256(f"{run_id}\n{tool}\n{canonical}{tail}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Refused:
    """The action must not run: the tool error to report instead."""

    error_class: str
    message: str
    record: EffectRecord | None = None
    """The record found under the key (``ambiguous``: the claim in doubt)."""


async def claim_effect(
    effects: EffectStore | None, tool: EffectTool, key: str, fingerprint: str, *, run_id: str = ""
) -> dict[str, Any] | Refused | None:
    """Claim a write's key before it runs.

    Returns ``None`` (run it), the recorded outcome (JSON) to return instead of running, or :class:`Refused`. A
    claim found ``started`` (an attempt that died without a result) is run again only for a tool whose downstream
    honours the key (``idempotent``); for any other it is in doubt and goes to reconciliation.
    """
    if tool.side_effect != "write" or effects is None:
        return None
    found = await effects.effect_begin(
        key, EffectRecord(fingerprint, tool=tool.name, run_id=run_id, started_at=time.time())
    )
    if found is None:
        return None
    if found.action_sha256 != fingerprint:
        fields = ", ".join(tool.key_fields) or "arguments"
        return Refused(
            "idempotency_conflict",
            f"not performed: {tool.name} already ran in this turn for the same {fields} with other arguments, "
            "and one action is never performed twice with different arguments; use what it returned, or ask the user",
        )
    if found.status != "done" and running_here(key):  # a sibling call of this process is running it: its result
        claimed, again = await _after_sibling(effects, tool, key, fingerprint, run_id)
        if claimed:
            return None
        found = again or found
    if found.status != "done" and tool.idempotent:  # the downstream answers a key it has seen: run it again
        return None
    if found.status != "done" or found.outcome is None:
        return Refused(
            "ambiguous",
            f"not performed again: an earlier attempt of this turn started {tool.name} with these arguments and "
            "its outcome is unknown; tell the user it may already have happened",
            found,
        )
    return found.outcome


_RUNNING: Counter[str] = Counter()
"""Calls of this process (every event loop and thread of it) claiming or executing each key right now."""
_RUNNING_LOCK = threading.Lock()
_SIBLING_POLL_S = 0.01


def running_here(key: str, *, besides_me: bool = True) -> bool:
    """Whether another call of this process (besides the caller, itself inside :func:`running`) works on ``key``."""
    with _RUNNING_LOCK:
        return _RUNNING[key] > (1 if besides_me else 0)


@contextlib.contextmanager
def running(key: str) -> Iterator[None]:
    """Count this call as working on ``key`` (claiming, executing, settling) while the block runs."""
    with _RUNNING_LOCK:
        _RUNNING[key] += 1
    try:
        yield
    finally:
        with _RUNNING_LOCK:
            _RUNNING[key] -= 1
            if _RUNNING[key] <= 0:
                del _RUNNING[key]


async def _after_sibling(
    effects: EffectStore, tool: EffectTool, key: str, fingerprint: str, run_id: str
) -> tuple[bool, EffectRecord | None]:
    """Wait (at most the tool's timeout) while a sibling call of this process works on ``key``; read it meanwhile.

    A caller racing an execution in flight gets that execution's recorded outcome instead of "unknown": the claim is
    no crashed attempt's, it is alive here. Returns ``(True, None)`` when the sibling failed and released the claim
    and this call took it, else ``(False, the record as it last stood)``.
    """
    deadline = time.monotonic() + tool.timeout_s
    found: EffectRecord | None = None
    # polled: the sibling may run on another thread's event loop, where no asyncio.Event of this loop reaches
    while running_here(key) and time.monotonic() < deadline:
        await asyncio.sleep(_SIBLING_POLL_S)
        found = await effects.effect_begin(
            key, EffectRecord(fingerprint, tool=tool.name, run_id=run_id, started_at=time.time())
        )
        if found is None:
            return True, None
        if found.status == "done":
            break
    return False, found


async def settle_effect(
    effects: EffectStore | None, tool: EffectTool, key: str, fingerprint: str, outcome: dict[str, Any] | None
) -> None:
    """Record a write's successful ``outcome`` (JSON) under its key, or release the claim (``None``)."""
    if tool.side_effect != "write" or effects is None:
        return
    await effects.effect_finish(
        key, EffectRecord(fingerprint, "done", outcome, tool=tool.name) if outcome is not None else None
    )


async def doubt_effect(
    effects: EffectStore | None,
    tool: EffectTool,
    key: str,
    fingerprint: str,
    info: Mapping[str, str],
    found: EffectRecord | None = None,
) -> None:
    """Route a write whose outcome is unknown (its claim kept) to reconciliation; it is never re-run by itself.

    ``found``: the claim as stored, when the gateway read it (else one is described from ``info``).
    """
    if tool.side_effect != "write" or effects is None:
        return
    record = found or EffectRecord(fingerprint, tool=tool.name, run_id=info.get("run_id", ""), started_at=time.time())
    await effects.effect_doubt(key, record, info)
