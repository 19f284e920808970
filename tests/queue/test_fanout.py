"""Readers of the per-shard indexes give the totals and listings one global index gave, on the real embedded server."""

from __future__ import annotations

import json

import redis.asyncio as aioredis

from switchboard.control.operations import list_dead_letters
from switchboard.control.reading import pending_approvals, recent_sessions
from switchboard.control.scope import OperatorScope
from switchboard.core.messages import session_key
from switchboard.queue.approvals import approval_member
from switchboard.queue.fanout import ScoreCursor, lowest, stream_merged, zset_merged
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import FENCED_FIELD, SessionKeys, ShardKeys
from switchboard.queue.shards import shard_of
from switchboard.queue.stats import fenced_total, read_stats
from switchboard.settings import QueueSettings
from tests.queue.conftest import make_message
from tests.queue.test_approvals import record_for

EVERYONE = OperatorScope.everything("console:test")
SESSIONS = [session_key("acme", "assistant", "telegram", "bot1", f"chat-{i}") for i in range(60)]


def _sessions(shard: ShardKeys) -> str:
    return shard.sessions


async def test_read_stats_sums_the_counters_of_sessions_spread_over_many_shards(
    async_redis: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(async_redis, queue_settings)
    messages = [make_message("hi", conversation=f"chat-{i}", dedup=f"u{i}") for i in range(30)]
    for message in messages:
        await ingestor.ingest(message)
    await ingestor.ingest(make_message("hi", conversation="chat-0", dedup="u0"))  # a duplicate
    shards = {SessionKeys(m.session_key).shard for m in messages}
    assert len(shards) > 25
    for shard in list(shards)[:3]:
        await async_redis.hincrby(shard.stats, FENCED_FIELD, 2)
    await async_redis.hset(ShardKeys(1023).histogram("run"), mapping={"le:0.5": 2, "sum": "0.75"})
    await async_redis.hset(ShardKeys(0).histogram("run"), mapping={"le:0.5": 1, "le:+Inf": 1, "sum": "100.25"})

    stats = await read_stats(async_redis)
    assert (stats.accepted, stats.deduplicated, stats.runnable_sessions) == (30, 1, 30)
    assert stats.fenced_rejections == 6 == await fenced_total(async_redis)
    assert stats.run_duration.count == 4 and stats.run_duration.sum == 101.0
    assert dict(stats.run_duration.buckets)[0.5] == 3


async def test_the_session_listing_pages_in_order_across_shards(async_redis: aioredis.Redis) -> None:
    # scores with ties (several sessions active in the same ms), spread over many shards
    scores = {s: 1_000 + (i // 3) for i, s in enumerate(SESSIONS)}
    for session, score in scores.items():
        await async_redis.zadd(SessionKeys(session).shard.sessions, {session: score})
    assert len({shard_of(s) for s in SESSIONS}) > 50
    expected = sorted(SESSIONS, key=lambda s: (scores[s], s.encode()), reverse=True)

    pages: list[list[str]] = []
    cursor: ScoreCursor | None = None
    while True:
        page = await recent_sessions(async_redis, EVERYONE, 7, after=cursor)
        if not page:
            break
        pages.append([s for s, _ in page])
        cursor = ScoreCursor.decode(page[-1][1].encode())  # as a URL would carry it
    assert [s for page in pages for s in page] == expected
    assert [len(p) for p in pages] == [7] * 8 + [4]
    only = OperatorScope(operator="console:k", tenants=frozenset({"beta"}))
    assert await recent_sessions(async_redis, only, 7) == []

    # a small first read per shard still gives every member in order (shards read again as they run dry)
    merged = [m async for m, _ in zset_merged(async_redis, _sessions, batch=1)]
    assert merged == expected
    upward = [m async for m, _ in zset_merged(async_redis, _sessions, descending=False, through=1_002, batch=2)]
    assert upward == sorted((s for s in SESSIONS if scores[s] <= 1_002), key=lambda s: (scores[s], s.encode()))


async def test_dead_letters_list_newest_first_across_shards(async_redis: aioredis.Redis) -> None:
    beta = session_key("beta", "assistant", "web", "w", "c1")
    written = []
    for i in range(40):
        session = SESSIONS[i % 20] if i % 5 else beta
        record = {"session": session, "message_ids": [f"m{i}"], "attempts": 3, "reason": "boom", "at": float(i)}
        entry_id = f"{5_000 + i // 2}-{i % 2}"  # equal milliseconds in different shards
        await async_redis.xadd(SessionKeys(session).shard.dead_letters, {"record": json.dumps(record)}, id=entry_id)
        written.append((entry_id, session))
    newest = list(reversed(written))

    found = await list_dead_letters(async_redis, EVERYONE, 1000)
    assert [(d.id, d.session) for d in found] == newest
    assert [(d.id, d.session) for d in await list_dead_letters(async_redis, EVERYONE, 5)] == newest[:5]
    acme = OperatorScope(operator="console:k", tenants=frozenset({"acme"}))
    assert [d.id for d in await list_dead_letters(async_redis, acme, 9)] == [i for i, s in newest if s != beta][:9]
    streamed = [eid async for _shard, eid, _fields in stream_merged(async_redis, lambda s: s.dead_letters, batch=1)]
    assert streamed == [i for i, _s in newest]


async def test_pending_approvals_merge_every_shards_index(async_redis: aioredis.Redis) -> None:
    records = []
    for i, session in enumerate(SESSIONS[:12]):
        record = record_for(session, expires_in=600.0 + i)
        record = record.model_copy(update={"requested_at": 100.0 + i})
        shard = SessionKeys(session).shard
        keys = SessionKeys(session)
        await async_redis.hset(
            keys.approval(record.id), mapping={"record": record.model_dump_json(), "status": "pending"}
        )
        member = approval_member(session, record.id)
        await async_redis.zadd(shard.approvals_due, {member: record.expires_at})
        await async_redis.zadd(shard.approvals_pending("acme"), {member: record.requested_at})
        records.append(record)
    acme = OperatorScope(operator="console:k", tenants=frozenset({"acme"}))
    for scope in (EVERYONE, acme):
        found = await pending_approvals(async_redis, scope, 5)
        assert [r.id for r in found] == [r.id for r in records[:5]]


async def _fill_runnable(client: aioredis.Redis) -> dict[str, float]:
    scores = {session: 1_000.0 + (i * 37) % 60 for i, session in enumerate(SESSIONS)}
    for session, score in scores.items():
        await client.zadd(SessionKeys(session).shard.runnable, {session: score})
    return scores


async def test_lowest_gives_the_oldest_members_over_every_shard_in_one_command_on_one_server(
    async_redis: aioredis.Redis,
) -> None:
    scores = await _fill_runnable(async_redis)
    assert len({shard_of(s) for s in SESSIONS}) > 40
    expected = sorted(scores.items(), key=lambda item: (item[1], item[0]))
    await async_redis.config_resetstat()
    found = await lowest(async_redis, lambda shard: shard.runnable, 7)
    stats = await async_redis.info("commandstats")
    assert found == expected[:7]
    assert stats["cmdstat_zunion"]["calls"] == 1 and "cmdstat_zrangebyscore" not in stats  # a sweep is one command
    through = expected[20][1]
    assert await lowest(async_redis, lambda shard: shard.runnable, 100, through=through) == [
        item for item in expected if item[1] <= through
    ]
