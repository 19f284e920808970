"""Read-only views for operators: sessions and their live state, timelines, pending approvals, usage."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Final

import redis.asyncio as aioredis

from switchboard.control.scope import NotFoundError, OperatorScope, session_parts
from switchboard.control.views import (
    BudgetAlertView,
    BudgetView,
    PersonView,
    SessionState,
    SessionView,
    TimelineEntry,
    UsageRow,
)
from switchboard.core.approvals.records import ApprovalRecord, SessionControl
from switchboard.core.messages import session_key
from switchboard.queue.approvals import parse_approval_member, record_from_fields
from switchboard.queue.budgets import Budgets
from switchboard.queue.connection import AsyncClient
from switchboard.queue.eventlog import decode_entries, read_events
from switchboard.queue.fanout import ScoreCursor, zset_merged
from switchboard.queue.keys import GlobalKeys, SessionKeys, ShardKeys
from switchboard.queue.people import People
from switchboard.settings import FileConfig
from switchboard.tracing import trace_hex
from switchboard.types import SessionKey

__all__ = [
    "SCAN_LIMIT",
    "USAGE_EVENTS",
    "budget_views",
    "escaped_tenant",
    "pending_approvals",
    "people_views",
    "recent_sessions",
    "session_views",
    "sessions_in_scope",
    "tenants_in_scope",
    "timeline_of",
    "usage_rows",
]

SCAN_LIMIT: Final = 5_000
"""Most recently active sessions examined when listing one operator's sessions or summing usage."""
USAGE_EVENTS: Final = 1_000
"""Event-log entries read per session when summing usage (the log is capped; older usage is in the totals)."""
_GLOBAL = GlobalKeys()


def _sessions(shard: ShardKeys) -> str:
    return shard.sessions


def _due(shard: ShardKeys) -> str:
    return shard.approvals_due


def _pending(tenant: str, shard: ShardKeys) -> str:
    return shard.approvals_pending(tenant)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def escaped_tenant(tenant: str) -> str:
    """A tenant name as its session keys (and the per-tenant keys) spell it."""
    return session_key(tenant, "a", "web", "a", "a").split("/", 1)[0]


async def recent_sessions(
    redis: AsyncClient,
    scope: OperatorScope,
    limit: int,
    keep: Callable[[list[str]], bool] | None = None,
    *,
    after: ScoreCursor | None = None,
) -> list[tuple[SessionKey, ScoreCursor]]:
    """The ``limit`` most recently active sessions of the scope's tenants after ``after``, newest first, with cursors.

    Every shard's sessions index merged by last activity (each shard read ``limit`` at a time, never whole); at most
    :data:`SCAN_LIMIT` examined. With ``keep``, only sessions whose key parts (unescaped) it keeps. A page's last
    cursor is where the next page starts.
    """
    found: list[tuple[SessionKey, ScoreCursor]] = []
    batch = min(max(limit, 1), 500)
    examined = 0
    async for key, score in zset_merged(redis, _sessions, after=after, batch=batch):
        examined += 1
        if examined > SCAN_LIMIT:
            break
        try:
            parts = session_parts(key)
        except NotFoundError:
            continue
        if scope.allows(parts[0]) and (keep is None or keep(parts)):
            found.append((SessionKey(key), ScoreCursor(score, key)))
            if len(found) >= limit:
                break
    return found


async def sessions_in_scope(
    redis: AsyncClient, scope: OperatorScope, limit: int, keep: Callable[[list[str]], bool] | None = None
) -> list[SessionKey]:
    """The ``limit`` most recently active sessions of the scope's tenants, newest first (:func:`recent_sessions`)."""
    return [session for session, _cursor in await recent_sessions(redis, scope, limit, keep)]


def _state(
    leased: bool, controlled: bool, pending: int, depth: int, head_error: bool, deferred: bool, tools_open: bool
) -> SessionState:
    if controlled:
        return "taken_over"
    if leased:
        if head_error:
            return "retrying"
        return "waiting_for_data" if tools_open else "reasoning"
    if pending:
        return "waiting_for_approval"
    if depth and (head_error or deferred):
        return "retrying"
    return "queued" if depth else "done"


async def session_views(redis: aioredis.Redis, sessions: Sequence[SessionKey]) -> list[SessionView]:
    """Each session's live state (two round trips for all of them)."""
    if not sessions:
        return []
    now = time.time()
    async with redis.pipeline(transaction=False) as pipe:
        for session in sessions:
            keys = SessionKeys(session)
            pipe.hmget(keys.meta, ["channel", "last_at", "received"])
            pipe.llen(keys.inbox)
            pipe.exists(keys.lease)
            pipe.llen(keys.dead)
            pipe.get(keys.control)
            pipe.zcard(keys.approvals)
            pipe.lindex(keys.inbox, 0)
            pipe.zscore(keys.shard.deferred, session)
            pipe.hlen(keys.tool_statuses)
            pipe.zscore(keys.shard.sessions, session)
        values = await pipe.execute()
    heads = {i: _text(values[10 * i + 6]) for i in range(len(sessions)) if values[10 * i + 6]}
    errors: dict[int, Any] = {}
    if heads:
        async with redis.pipeline(transaction=False) as pipe:
            for i, head in heads.items():
                pipe.hget(SessionKeys(sessions[i]).attempts, f"{head}:error")
            errors = dict(zip(heads, await pipe.execute(), strict=True))
    out: list[SessionView] = []
    for i, session in enumerate(sessions):
        meta, depth, leased, dead, control, pending, _head, deferred, tools_open, score = values[10 * i : 10 * i + 10]
        channel, last_at, received = (_text(v) if v is not None else "" for v in meta)
        parts = session_parts(session)
        held = SessionControl.model_validate_json(control) if control else None
        state = _state(
            bool(leased),
            held is not None,
            int(pending),
            int(depth),
            bool(_text(errors.get(i))),
            deferred is not None and float(deferred) > now,
            bool(tools_open),
        )
        out.append(
            SessionView(
                key=session,
                tenant=parts[0],
                agent=parts[1],
                channel=channel or parts[2],
                state=state,
                last_activity=float(last_at or score or 0) / 1000,
                inbox_depth=int(depth),
                controlled_by=held.operator if held is not None else None,
                pending_approvals=int(pending),
                received=int(received or 0),
                dead_letters=int(dead),
            )
        )
    return out


async def timeline_of(redis: aioredis.Redis, session: SessionKey, limit: int) -> list[TimelineEntry]:
    """The session's last ``limit`` events, oldest first, each with the trace id of the request it belongs to."""
    entries: list[TimelineEntry] = []
    for item in await read_events(redis, session, limit):
        data = {k: v for k, v in item.items() if k not in {"id", "ts", "kind", "at"}}
        message_id = item.get("message_id")
        at = item.get("at", item.get("ts"))
        entries.append(
            TimelineEntry(
                id=str(item["id"]),
                at=float(at) if isinstance(at, int | float) else None,
                kind=str(item.get("kind", "")),
                trace_id=trace_hex(message_id) if isinstance(message_id, str) and message_id else None,
                data=data,
            )
        )
    return entries


async def pending_approvals(redis: aioredis.Redis, scope: OperatorScope, limit: int) -> list[ApprovalRecord]:
    """Pending approvals of the scope's tenants, oldest first (at most ``limit``)."""
    indexes: list[Callable[[ShardKeys], str]] = (
        [_due]
        if scope.unrestricted
        else [functools.partial(_pending, escaped_tenant(t)) for t in sorted(scope.tenants)]
    )
    members: list[Any] = []
    for index in indexes:  # each merged over the shards, its first ``limit`` by score
        taken = 0
        async for member, _score in zset_merged(redis, index, descending=False, batch=min(max(limit, 1), 100)):
            members.append(member)
            taken += 1
            if taken >= limit:
                break
    pairs = [parse_approval_member(m) for m in members]
    if not pairs:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for session, approval_id in pairs:
            pipe.hgetall(SessionKeys(session).approval(approval_id))
        rows = await pipe.execute()
    records = [r for r in (record_from_fields(row) for row in rows) if r is not None and r.status == "pending"]
    records = [r for r in records if scope.allows(session_parts(r.session)[0])]
    records.sort(key=lambda r: r.requested_at)
    return records[:limit]


async def usage_rows(redis: aioredis.Redis, scope: OperatorScope) -> list[UsageRow]:
    """Credits, tokens and runs per tenant and agent, summed from the metered usage in the sessions' event logs."""
    sessions = await sessions_in_scope(redis, scope, SCAN_LIMIT)
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0, 0, 0])
    for start in range(0, len(sessions), 200):
        chunk = sessions[start : start + 200]
        async with redis.pipeline(transaction=False) as pipe:
            for session in chunk:
                pipe.xrevrange(SessionKeys(session).events, count=USAGE_EVENTS)
            logs = await pipe.execute()
        for session, log in zip(chunk, logs, strict=True):
            parts = session_parts(session)
            for event in decode_entries(log or []):
                if event.get("kind") != "usage_metered":
                    continue
                row = sums[(parts[0], parts[1])]
                row[0] += float(event.get("credits") or 0.0)
                row[1] += int(event.get("input_tokens") or 0)
                row[2] += int(event.get("output_tokens") or 0)
                row[3] += 0 if event.get("characters") else 1  # a voice reply's speech is metered, not a run
    return [
        UsageRow(tenant, agent, credits=v[0], input_tokens=int(v[1]), output_tokens=int(v[2]), runs=int(v[3]))
        for (tenant, agent), v in sorted(sums.items())
    ]


def tenants_in_scope(config: FileConfig, scope: OperatorScope) -> list[str]:
    """The configured tenants (the default one and each ``tenants.<name>`` block) the operator may see."""
    names = sorted({config.tenant, *config.tenants, *(r.tenant for r in config.budgets if r.tenant)})
    return [name for name in names if scope.allows(name)]


async def budget_views(
    redis: aioredis.Redis, config: FileConfig, scope: OperatorScope, *, alerts: int = 50
) -> tuple[list[BudgetView], list[BudgetAlertView]]:
    """Each live budget counter of the operator's tenants, and their latest alerts (newest first)."""
    budgets = Budgets(redis, config.budgets)
    rows: list[BudgetView] = []
    found: list[BudgetAlertView] = []
    for tenant in tenants_in_scope(config, scope):
        rows += [BudgetView(**dataclasses.asdict(row)) for row in await budgets.live(tenant)]
        entries: Any = await redis.xrevrange(_GLOBAL.budget_alerts(tenant), count=alerts)
        for _id, fields in entries:
            text = {_text(k): _text(v) for k, v in fields.items()}
            found.append(
                BudgetAlertView(
                    tenant=tenant,
                    at=float(text["at"]),
                    scope=text["scope"],
                    subject=text["subject"],
                    period=text["period"],
                    threshold=float(text["threshold"]),
                    spent=float(text["spent"]),
                    credits=float(text["credits"]),
                )
            )
    found.sort(key=lambda a: a.at, reverse=True)
    return rows, found[:alerts]


async def people_views(redis: aioredis.Redis, config: FileConfig, scope: OperatorScope) -> list[PersonView]:
    """The linked people of the operator's tenants."""
    people = People(redis)
    out: list[PersonView] = []
    for tenant in tenants_in_scope(config, scope):
        out += [PersonView(tenant, person, linked) for person, linked in (await people.everyone(tenant)).items()]
    return out
