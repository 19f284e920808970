"""Dead letters and requeue, effects awaiting reconciliation and their resolution (operators' repairs)."""

from __future__ import annotations

import json
import time
from typing import Any, Final, Literal

import redis.asyncio as aioredis

from switchboard.control.reading import escaped_tenant
from switchboard.control.scope import InvalidRequestError, NotFoundError, OperatorScope, session_parts
from switchboard.control.views import DeadLetterView, DoubtView
from switchboard.core.messages import InboundMessage
from switchboard.core.sealing import DATA_KEYS_ENV, SealError
from switchboard.core.tools.effects import EFFECT_TTL_S, EffectRecord
from switchboard.queue import scripts
from switchboard.queue.connection import AsyncClient
from switchboard.queue.effects import doubt_field
from switchboard.queue.fanout import stream_merged
from switchboard.queue.keys import GlobalKeys, SessionKeys, ShardKeys, tenant_of
from switchboard.queue.ledger import SHARD_DEAD_LETTER_CAP
from switchboard.queue.sealed import dead_messages
from switchboard.types import SessionKey

__all__ = [
    "DEAD_LETTER_SCAN",
    "PREVIEW_CHARS",
    "dead_letter_messages",
    "list_dead_letters",
    "list_doubts",
    "requeue_key",
    "resolve_doubt",
]

DEAD_LETTER_SCAN: Final = 2_000
"""Most recent entries of the shards' dead-letter streams (merged newest first) examined per listing."""
PREVIEW_CHARS: Final = 200
_GLOBAL = GlobalKeys()
_ID_CHARS = frozenset("0123456789-")


def _dead_letters(shard: ShardKeys) -> str:
    return shard.dead_letters


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def requeue_key(dead_letter_id: str, index: int) -> str:
    """The dedup key a requeued message is ingested under (a second requeue of the same dead letter is a duplicate)."""
    return f"requeue:{dead_letter_id}:{index}"


def _record(fields: Any) -> dict[str, Any] | None:
    values = {_text(k): _text(v) for k, v in (fields or {}).items()}
    try:
        record = json.loads(values.get("record", ""))
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("session"), str) else None


def _preview(record: dict[str, Any]) -> str:
    try:
        messages = dead_messages(record)
    except SealError:  # a list of dead letters still shows; requeueing that one says why it cannot
        return f"(sealed with a key {DATA_KEYS_ENV} does not list)"
    first = messages[0] if messages and isinstance(messages[0], dict) else {}
    return str(first.get("text", ""))[:PREVIEW_CHARS]


async def list_dead_letters(redis: AsyncClient, scope: OperatorScope, limit: int) -> list[DeadLetterView]:
    """The scope's most recent dead letters, newest first (every shard's stream, merged; ids are the entries')."""
    found: list[tuple[str, dict[str, Any]]] = []
    examined = 0
    async for _shard, raw_id, fields in stream_merged(redis, _dead_letters, batch=min(limit, SHARD_DEAD_LETTER_CAP)):
        examined += 1
        if examined > DEAD_LETTER_SCAN:
            break
        record = _record(fields)
        if record is None:
            continue
        try:
            tenant = session_parts(record["session"])[0]
        except NotFoundError:
            continue
        if scope.allows(tenant):
            found.append((_text(raw_id), record))
            if len(found) >= limit:
                break
    if not found:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for entry_id, record in found:
            pipe.exists(SessionKeys(SessionKey(record["session"])).dedup(requeue_key(entry_id, 0)))
        requeued = await pipe.execute()
    return [
        DeadLetterView(
            id=entry_id,
            session=record["session"],
            message_ids=[str(i) for i in record.get("message_ids") or []],
            attempts=int(record.get("attempts") or 0),
            reason=str(record.get("reason", "")),
            at=float(record.get("at") or 0.0),
            preview=_preview(record),
            requeued=bool(again),
        )
        for (entry_id, record), again in zip(found, requeued, strict=True)
    ]


async def dead_letter_messages(redis: aioredis.Redis, session: SessionKey, dead_letter_id: str) -> list[InboundMessage]:
    """The messages of dead letter ``dead_letter_id`` of ``session``, as drafts to ingest again (new dedup keys).

    Raises:
        NotFoundError: no such dead letter of that session.
        InvalidRequestError: it holds no message to requeue.
    """
    if not dead_letter_id or not set(dead_letter_id) <= _ID_CHARS or len(dead_letter_id) > 40:
        raise NotFoundError(f"no dead letter {dead_letter_id[:40]!r}")
    entries: Any = await redis.xrange(SessionKeys(session).shard.dead_letters, dead_letter_id, dead_letter_id)
    record = _record(entries[0][1]) if entries else None
    if record is None or record["session"] != session:
        raise NotFoundError(f"no dead letter {dead_letter_id} in {session}")
    drafts = []
    for index, body in enumerate(dead_messages(record)):
        message = InboundMessage.model_validate(body)
        drafts.append(message.model_copy(update={"id": "", "dedup_key": requeue_key(dead_letter_id, index)}))
    if not drafts:
        raise InvalidRequestError(f"dead letter {dead_letter_id} holds no message to requeue")
    return drafts


def _doubt_view(entry: dict[str, Any]) -> DoubtView:
    record = entry.get("record") if isinstance(entry.get("record"), dict) else {}
    info = entry.get("info") if isinstance(entry.get("info"), dict) else {}
    assert isinstance(record, dict) and isinstance(info, dict)
    started = record.get("started_at", info.get("started_at"))
    return DoubtView(
        session=str(entry.get("session", "")),
        key=str(entry.get("key", "")),
        tool=str(record.get("tool") or info.get("tool") or ""),
        run_id=str(record.get("run_id") or info.get("run_id") or ""),
        action_sha256=str(record.get("action_sha256", "")),
        started_at=float(started) if isinstance(started, int | float) else None,
        at=float(entry.get("at") or 0.0),
        info=info,
        resolution=entry.get("resolution"),
        resolved_by=entry.get("resolved_by"),
        resolved_at=entry.get("resolved_at"),
    )


async def _doubt_indexes(redis: aioredis.Redis, scope: OperatorScope) -> list[str]:
    """The per-shard reconciliation indexes to read: the scope's tenants' in every shard, or every one there is."""
    if not scope.unrestricted:
        tenants = [escaped_tenant(t) for t in sorted(scope.tenants)]
        return [shard.effects_in_doubt(t) for t in tenants for shard in ShardKeys.every()]
    heads = {shard.effects_in_doubt("") for shard in ShardKeys.every()}
    found = {_text(k) async for k in redis.scan_iter(match=_GLOBAL.every_shard("effects:doubt:*"), count=1000)}
    # a match is an index only when what precedes the tenant is one shard's prefix
    return sorted(k for k in found if k[: k.find("}:effects:doubt:") + len("}:effects:doubt:")] in heads)


async def list_doubts(redis: aioredis.Redis, scope: OperatorScope, *, include_resolved: bool) -> list[DoubtView]:
    """The scope's effects awaiting reconciliation (and resolved ones, with ``include_resolved``), oldest first.

    A restricted scope reads its tenants' index in every shard (one pipeline); an unrestricted one scans for them.
    """
    indexes = await _doubt_indexes(redis, scope)
    async with redis.pipeline(transaction=False) as pipe:
        for index in indexes:
            pipe.hgetall(index)
        hashes = await pipe.execute()
    views: list[DoubtView] = []
    for found in hashes:
        for raw in found.values():
            entry = json.loads(raw)
            if isinstance(entry, dict) and (include_resolved or not entry.get("resolution")):
                views.append(_doubt_view(entry))
    views.sort(key=lambda v: v.at)
    return views


def _reconciled(tool: str, outcome: Literal["done", "failed"], operator: str) -> dict[str, Any]:
    """The tool outcome a re-run of the turn gets instead of performing the call again."""
    if outcome == "done":
        return {"tool": tool, "ok": True, "value": {"reconciled": f"{operator} confirmed this action was performed"}}
    return {
        "tool": tool,
        "ok": False,
        "error": f"not performed: {operator} confirmed this action did not happen; ask the user before trying again",
        "error_class": "reconciled_not_performed",
    }


async def resolve_doubt(
    redis: aioredis.Redis, session: SessionKey, key: str, outcome: Literal["done", "failed"], operator: str
) -> DoubtView:
    """Record an operator's word on an effect in doubt; its claim becomes ``done`` with that outcome.

    Raises:
        NotFoundError: no such effect awaiting reconciliation (or already resolved).
    """
    tenant = tenant_of(session)
    field = doubt_field(session, key)
    index = SessionKeys(session).shard.effects_in_doubt(tenant)
    raw = await redis.hget(index, field)
    if raw is None:
        raise NotFoundError(f"no effect {key[:80]!r} awaiting reconciliation in {session}")
    entry = json.loads(raw)
    view = _doubt_view(entry)
    resolved = {**entry, "resolution": outcome, "resolved_by": operator, "resolved_at": time.time()}
    done = EffectRecord(
        action_sha256=view.action_sha256, status="done", outcome=_reconciled(view.tool, outcome, operator)
    )
    changed = await scripts.EFFECT_RESOLVE(
        redis,
        [index, SessionKeys(session).effect(key)],
        [
            field,
            json.dumps(resolved, separators=(",", ":"), default=str),
            done.to_json(),
            view.action_sha256,
            EFFECT_TTL_S * 1000,
        ],
    )
    if not int(changed):
        raise NotFoundError(f"the effect {key[:80]!r} of {session} was already resolved")
    return _doubt_view(resolved)
