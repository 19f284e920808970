"""The per-shard index readers through redis-py's cluster client, on the real test cluster."""

from __future__ import annotations

import json

import pytest
from redis.asyncio.cluster import RedisCluster

from switchboard.control.operations import list_dead_letters
from switchboard.control.reading import recent_sessions
from switchboard.control.scope import OperatorScope
from switchboard.core.messages import session_key
from switchboard.queue.fanout import ScoreCursor, lowest
from switchboard.queue.keys import FENCED_FIELD, SessionKeys
from switchboard.queue.stats import read_stats

pytestmark = pytest.mark.cluster

EVERYONE = OperatorScope.everything("console:test")
SESSIONS = [session_key("acme", "assistant", "telegram", "bot1", f"chat-{i}") for i in range(50)]


async def test_stats_listings_and_dead_letters_read_every_shard_through_the_cluster_client(cluster_url: str) -> None:
    rc = RedisCluster.from_url(cluster_url)
    try:
        for i, session in enumerate(SESSIONS):
            shard = SessionKeys(session).shard
            await rc.hincrby(shard.stats, "accepted", 1)
            await rc.hincrby(shard.stats, FENCED_FIELD, i % 2)
            await rc.zadd(shard.runnable, {session: i})
            await rc.zadd(shard.sessions, {session: 1_000 + i // 2})
            record = {"session": session, "message_ids": [f"m{i}"], "attempts": 1, "reason": "x", "at": float(i)}
            await rc.xadd(shard.dead_letters, {"record": json.dumps(record)}, id=f"{7_000 + i}-0")
        slots = {int(await rc.cluster_keyslot(SessionKeys(s).shard.stats)) for s in SESSIONS}
        nodes = {rc.get_node_from_key(SessionKeys(s).shard.stats).name for s in SESSIONS}
        assert len(slots) > 40 and len(nodes) == 3  # the data really sits on every primary

        stats = await read_stats(rc)
        assert (stats.accepted, stats.fenced_rejections, stats.runnable_sessions) == (50, 25, 50)
        oldest = await lowest(rc, lambda shard: shard.runnable, 5)  # per shard, merged: no ZUNION across slots
        assert oldest == [(SESSIONS[i], float(i)) for i in range(5)]
        assert [m for m, _ in await lowest(rc, lambda shard: shard.runnable, 50, through=2.0)] == SESSIONS[:3]

        expected = sorted(SESSIONS, key=lambda s: (1_000 + SESSIONS.index(s) // 2, s.encode()), reverse=True)
        listed: list[str] = []
        cursor: ScoreCursor | None = None
        while page := await recent_sessions(rc, EVERYONE, 9, after=cursor):
            listed += [s for s, _ in page]
            cursor = page[-1][1]
        assert listed == expected

        letters = await list_dead_letters(rc, EVERYONE, 10)
        assert [d.session for d in letters] == list(reversed(SESSIONS))[:10]
    finally:
        await rc.aclose()
