"""Tests' reads of the per-shard indexes over every shard (what a single global key answered before)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from switchboard.queue.fanout import each_shard, sum_counts
from switchboard.queue.keys import ShardKeys


def _summed(hashes: list[Any]) -> dict[bytes, bytes]:
    return {k.encode(): v.encode() for k, v in sum_counts(hashes).items()}


async def stats_of(client: aioredis.Redis) -> dict[bytes, bytes]:
    """Every shard's stats hash summed, as one ``HGETALL`` of the old global hash answered."""
    return _summed(await each_shard(client, lambda pipe, shard: pipe.hgetall(shard.stats)))


def stats_sync(client: redis.Redis) -> dict[bytes, bytes]:
    """:func:`stats_of` with a sync client."""
    with client.pipeline(transaction=False) as pipe:
        for shard in ShardKeys.every():
            pipe.hgetall(shard.stats)
        return _summed(pipe.execute())


async def members_of(client: aioredis.Redis, index: Callable[[ShardKeys], str]) -> list[bytes]:
    """Every member of one per-shard ZSET (``lambda s: s.sessions``), shard by shard."""
    return [m for members in await each_shard(client, lambda pipe, s: pipe.zrange(index(s), 0, -1)) for m in members]


async def count_of(client: aioredis.Redis, index: Callable[[ShardKeys], str]) -> int:
    """Members of one per-shard ZSET over every shard."""
    return sum(await each_shard(client, lambda pipe, s: pipe.zcard(index(s))))


def count_sync(client: redis.Redis, index: Callable[[ShardKeys], str]) -> int:
    """:func:`count_of` with a sync client."""
    with client.pipeline(transaction=False) as pipe:
        for shard in ShardKeys.every():
            pipe.zcard(index(shard))
        return sum(pipe.execute())


async def entries_of(client: aioredis.Redis) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """Every shard's dead-letter stream entries, shard by shard."""
    streams = await each_shard(client, lambda pipe, s: pipe.xrange(s.dead_letters))
    return [entry for entries in streams for entry in entries]


async def doubts_of(client: aioredis.Redis, tenant: str) -> int:
    """Fields of one tenant's effects-in-doubt hashes over every shard."""
    return sum(await each_shard(client, lambda pipe, s: pipe.hlen(s.effects_in_doubt(tenant))))
