"""Reading a per-shard index over every shard: one non-transactional pipeline, then a merge.

Writers keep each index (runnable, sessions, deferred, dead letters, stats, approvals, effects in doubt) in the
session's shard (:class:`~switchboard.queue.keys.ShardKeys`), so a script stays in one slot. A reader that wants the
whole deployment's view asks every shard in one ``pipeline(transaction=False)`` (one round trip on a single node; on
redis-py's ``RedisCluster`` the pipeline is split per node) and merges:

- :func:`each_shard`: one command per shard, the replies in shard order (counters are summed with :func:`sum_counts`);
- :func:`zset_merged`: the members of every shard's ZSET in one global order by score, read lazily (a listing reads
  each shard's next ``batch`` only, never a whole index): the first round asks every shard, a later one only the
  shard whose buffer ran dry;
- :func:`stream_merged`: every shard's stream entries newest first, the same way;
- :func:`zscan_every`: the members matching a pattern in every shard's ZSET (erasure, lookups by id).
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis

from switchboard.queue.connection import AsyncClient
from switchboard.queue.keys import ShardKeys

__all__ = [
    "ALL_SHARDS",
    "ScoreCursor",
    "each_shard",
    "lowest",
    "stream_merged",
    "sum_counts",
    "zscan_every",
    "zset_merged",
]

ALL_SHARDS: Final = ShardKeys.every()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def each_shard(
    redis: AsyncClient, command: Callable[[Any, ShardKeys], object], shards: Sequence[ShardKeys] = ALL_SHARDS
) -> list[Any]:
    """Run ``command(pipe, shard)`` (which queues one command) for each shard in one pipeline; the replies in order."""
    async with redis.pipeline(transaction=False) as pipe:
        for shard in shards:
            command(pipe, shard)
        return list(await pipe.execute())


async def zscan_every(
    redis: AsyncClient, key_of: Callable[[ShardKeys], str], match: str, shards: Sequence[ShardKeys] = ALL_SHARDS
) -> list[tuple[ShardKeys, str]]:
    """The members of every shard's ZSET ``key_of(shard)`` that ``match`` (a ``MATCH`` pattern), with their shard.

    The first ``ZSCAN`` page of every shard goes in one pipeline; a shard with more is scanned on to its end.
    """
    pages = await each_shard(redis, lambda pipe, shard: pipe.zscan(key_of(shard), 0, match=match, count=1000), shards)
    found: list[tuple[ShardKeys, str]] = []
    for shard, (cursor, members) in zip(shards, pages, strict=True):
        found += [(shard, _text(m)) for m, _ in members]
        while int(cursor):
            cursor, members = await redis.zscan(key_of(shard), cursor, match=match, count=1000)
            found += [(shard, _text(m)) for m, _ in members]
    return found


def sum_counts(hashes: Iterable[Mapping[bytes, bytes]]) -> dict[str, str]:
    """Field → the sum of its values over ``hashes`` (integers stay integers; a non-number counts 0)."""
    totals: dict[str, int | float] = {}
    for raw in hashes:
        for key, value in raw.items():
            text = _text(value)
            try:
                number: int | float = int(text)
            except ValueError:
                try:
                    number = float(text)
                except ValueError:
                    number = 0
            name = _text(key)
            totals[name] = totals.get(name, 0) + number
    return {name: repr(value) for name, value in totals.items()}


@dataclass(frozen=True, slots=True)
class ScoreCursor:
    """Where a page of a merged ZSET listing ended: its last member and score (the next page starts after it)."""

    score: float
    member: str

    def encode(self) -> str:
        """The cursor as text for a URL (``<score>:<member>``)."""
        return f"{self.score!r}:{self.member}"

    @classmethod
    def decode(cls, text: str) -> ScoreCursor:
        """A cursor from :meth:`encode`'s text.

        Raises:
            ValueError: not such a text.
        """
        score, sep, member = text.partition(":")
        if not sep:
            raise ValueError("a cursor is <score>:<member>")
        return cls(float(score), member)


class _Desc:
    """A member in reverse byte order (ZREVRANGEBYSCORE orders equal scores by member, descending)."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __lt__(self, other: _Desc) -> bool:
        return self.raw > other.raw


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


async def lowest(
    redis: AsyncClient,
    key_of: Callable[[ShardKeys], str],
    limit: int,
    *,
    through: float | None = None,
    shards: Sequence[ShardKeys] = ALL_SHARDS,
) -> list[tuple[str, float]]:
    """The ``limit`` lowest-scored members of every shard's ZSET ``key_of(shard)`` (scores ``<= through``), in order.

    For the periodic sweeps of an idle deployment: on one server a single ``ZUNION`` over the shards' keys (one
    command a sweep, however many shards; it returns every member, so it suits indexes of sessions waiting, not of
    every session); on a cluster, where one command cannot name keys of several slots, each shard's first ``limit``
    members in one pipeline (redis-py splits it per node), merged.
    """
    keys = [key_of(shard) for shard in shards]
    found: Iterable[tuple[float, bytes]]
    if isinstance(redis, aioredis.RedisCluster):
        end: float | str = through if through is not None else "+inf"
        async with redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.zrangebyscore(key, "-inf", end, start=0, num=limit, withscores=True)
            replies = await pipe.execute()
        found = heapq.merge(*([(float(s), _bytes(m)) for m, s in reply] for reply in replies))
    else:
        union: list[Any] = await redis.zunion(keys, aggregate="MIN", withscores=True)
        found = sorted((float(pair[1]), _bytes(pair[0])) for pair in union)
    picked: list[tuple[str, float]] = []
    for score, member in found:
        if (through is not None and score > through) or len(picked) >= limit:
            break
        picked.append((member.decode(), score))
    return picked


async def zset_merged(
    redis: AsyncClient,
    key_of: Callable[[ShardKeys], str],
    *,
    descending: bool = True,
    after: ScoreCursor | None = None,
    through: float | str | None = None,
    batch: int = 100,
    shards: Sequence[ShardKeys] = ALL_SHARDS,
) -> AsyncIterator[tuple[str, float]]:
    """Every shard's ZSET ``key_of(shard)`` as one, by score (highest first when ``descending``), lazily.

    Equal scores come in the member order Redis gives them. ``after``: start past that member (a page's cursor);
    ``through``: end at that score (included; a Redis range bound, ``(`` for excluded). The first round reads
    ``batch`` members of every shard; then only a shard whose members were all given out.
    """
    bound: float | str = after.score if after is not None else ("+inf" if descending else "-inf")
    end: float | str = through if through is not None else ("-inf" if descending else "+inf")
    cursor = (after.score, _bytes(after.member)) if after is not None else None

    def past(score: float, member: bytes) -> bool:
        if cursor is None:
            return True
        if descending:
            return (score, member) < cursor
        return (score, member) > cursor

    offsets = [0] * len(shards)
    done = [False] * len(shards)
    buffers: list[list[tuple[bytes, float]]] = [[] for _ in shards]
    heap: list[tuple[Any, int]] = []

    def order(item: tuple[bytes, float]) -> Any:
        return (-item[1], _Desc(item[0])) if descending else (item[1], item[0])

    todo = list(range(len(shards)))
    while True:
        while todo:
            async with redis.pipeline(transaction=False) as pipe:
                for i in todo:
                    key = key_of(shards[i])
                    if descending:
                        pipe.zrevrangebyscore(key, bound, end, start=offsets[i], num=batch, withscores=True)
                    else:
                        pipe.zrangebyscore(key, bound, end, start=offsets[i], num=batch, withscores=True)
                replies = await pipe.execute()
            again = []
            for i, reply in zip(todo, replies, strict=True):
                offsets[i] += len(reply)
                done[i] = len(reply) < batch
                items = [(_bytes(m), float(s)) for m, s in reply if past(float(s), _bytes(m))]
                items.reverse()  # popped from the end
                buffers[i] = items
                if items:
                    heapq.heappush(heap, (order(items[-1]), i))
                elif not done[i]:
                    again.append(i)
            todo = again
        if not heap:
            return
        _, i = heapq.heappop(heap)
        member, score = buffers[i].pop()
        yield member.decode(), score
        if buffers[i]:
            heapq.heappush(heap, (order(buffers[i][-1]), i))
        elif not done[i]:
            todo = [i]


def _entry_order(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


async def stream_merged(
    redis: AsyncClient,
    key_of: Callable[[ShardKeys], str],
    *,
    batch: int = 50,
    shards: Sequence[ShardKeys] = ALL_SHARDS,
) -> AsyncIterator[tuple[ShardKeys, str, dict[bytes, bytes]]]:
    """Every shard's stream ``key_of(shard)`` newest first, as ``(shard, entry id, fields)``, lazily."""
    last: list[bytes | None] = [None] * len(shards)
    done = [False] * len(shards)
    buffers: list[list[tuple[bytes, dict[bytes, bytes]]]] = [[] for _ in shards]
    heap: list[tuple[tuple[int, int], int]] = []

    def order(entry_id: bytes) -> tuple[int, int]:
        ms, seq = _entry_order(entry_id)
        return -ms, -seq

    todo = list(range(len(shards)))
    while True:
        while todo:
            async with redis.pipeline(transaction=False) as pipe:
                for i in todo:
                    oldest_read = last[i]
                    top = b"(" + oldest_read if oldest_read is not None else b"+"
                    pipe.xrevrange(key_of(shards[i]), max=top, min="-", count=batch)
                replies = await pipe.execute()
            again = []
            for i, reply in zip(todo, replies, strict=True):
                entries = [(_bytes(eid), fields) for eid, fields in reply or []]
                done[i] = len(entries) < batch
                if entries:
                    last[i] = entries[-1][0]
                entries.reverse()
                buffers[i] = entries
                if entries:
                    heapq.heappush(heap, (order(entries[-1][0]), i))
                elif not done[i]:
                    again.append(i)
            todo = again
        if not heap:
            return
        _, i = heapq.heappop(heap)
        entry_id, fields = buffers[i].pop()
        yield shards[i], entry_id.decode(), fields
        if buffers[i]:
            heapq.heappush(heap, (order(buffers[i][-1][0]), i))
        elif not done[i]:
            todo = [i]
