"""The logical shards: a session's shard is stable and spread evenly, and shard ``n``'s tag sits in slot ``16 n``."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
import redis.asyncio as aioredis
from redis.cluster import key_slot

from switchboard.core.messages import session_key
from switchboard.errors import FencedWriteError
from switchboard.queue.keys import FENCED_FIELD, SessionKeys, ShardKeys, session_in
from switchboard.queue.lease import LeaseToken, fenced_xadd
from switchboard.queue.shards import SHARDS, SLOTS_PER_SHARD, TAGS, generate_tags, shard_of, shard_tag
from switchboard.queue.stats import fenced_total, read_stats

SAMPLE = [session_key("acme", "assistant", "telegram", "bot1", f"chat-{i}") for i in range(200)]


def test_every_shard_tag_sits_in_its_own_slot() -> None:
    slots = [key_slot(f"sb:{{{tag}}}:inbox".encode()) for tag in TAGS]
    assert len(TAGS) == SHARDS == 16384 // SLOTS_PER_SHARD
    assert slots == [SLOTS_PER_SHARD * n for n in range(SHARDS)]
    assert len(set(TAGS)) == SHARDS and max(map(len, TAGS)) <= 6


def test_the_pinned_table_is_the_generated_one() -> None:
    assert generate_tags() == TAGS


def test_a_sessions_shard_is_the_same_in_another_process_with_another_hash_seed() -> None:
    here = [shard_of(s) for s in SAMPLE]
    code = (
        "import sys, json\n"
        "from switchboard.queue.shards import shard_of\n"
        "print(json.dumps([shard_of(s) for s in json.loads(sys.stdin.read())]))\n"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(SAMPLE),
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        assert json.loads(out) == here
    assert len(set(here)) > 150  # 200 sessions over 1,024 shards: not all in a few


def test_shards_pinned_for_known_sessions() -> None:
    # A session's shard is part of its key names: changing the function would orphan every stored session.
    assert shard_of("acme/assistant/telegram/bot1/chat-4242") == 0x3FF & _crc32_reference(
        b"acme/assistant/telegram/bot1/chat-4242"
    )
    assert shard_tag(SAMPLE[0]) == TAGS[shard_of(SAMPLE[0])]


def _crc32_reference(data: bytes) -> int:
    """CRC-32 (IEEE, reflected, poly 0xEDB88320) bit by bit, independent of zlib."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_100k_sessions_spread_evenly_over_the_shards() -> None:
    counts = [0] * SHARDS
    for i in range(100_000):
        counts[shard_of(session_key(f"tenant{i % 37}", "assistant", "telegram", f"bot{i % 5}", str(10_000 + i)))] += 1
    mean = 100_000 / SHARDS  # 97.66
    # Binomial(100k, 1/1024): sd ~ 9.9; 1,024 shards stay within about 3.5 sd of the mean.
    assert min(counts) > mean - 40 and max(counts) < mean + 40, (min(counts), max(counts))
    assert statistics.pstdev(counts) < 1.3 * (mean * (1 - 1 / SHARDS)) ** 0.5


def test_session_keys_carry_their_shards_tag_and_read_back_as_the_session() -> None:
    # a component may hold ":" (WhatsApp group ids, Slack thread stamps): the brackets end the session, not a colon
    session = session_key("acme", "assistant", "slack", "T1", "C1:1700000000.0001", "x:y")
    keys = SessionKeys(session)
    for key in (keys.inbox, keys.lease, keys.dedup("a:b>:c"), keys.fenced_rejections):
        assert key_slot(key.encode()) == SLOTS_PER_SHARD * shard_of(session)
    assert keys.inbox == f"sb:{{{shard_tag(session)}}}:<{session}>:inbox"
    assert session_in(keys.dedup("a:b>:c")) == session and session_in(keys.inbox) == session
    other = (shard_of(session) + 1) % SHARDS
    assert session_in(keys.inbox.replace(shard_tag(session), TAGS[other], 1)) is None  # a tag not the session's
    assert session_in(ShardKeys(other).fenced_rejections) is None
    assert session_in("sb:{rate:telegram/default}:send") is None


def test_every_shard_index_is_in_its_shards_slot() -> None:
    for shard in ShardKeys.every():
        names = [
            shard.stats, shard.fenced_rejections, shard.histogram("run"), shard.runnable, shard.sessions,
            shard.deferred, shard.dead_letters, shard.approvals_due, shard.approvals_pending("acme"),
            shard.effects_in_doubt("acme"),
        ]  # fmt: skip
        assert {key_slot(k.encode()) for k in names} == {SLOTS_PER_SHARD * shard.shard}
        assert shard.fenced_rejections == shard.stats  # the fence counts in the stats hash a scrape reads
    assert len({shard.stats for shard in ShardKeys.every()}) == SHARDS
    assert ShardKeys(5).runnable == f"sb:{{{TAGS[5]}}}:runnable"


async def test_fenced_refusals_count_in_their_shard_and_metrics_read_the_sum(async_redis: aioredis.Redis) -> None:
    sessions = [session_key("acme", "assistant", "telegram", "bot1", f"chat-{i}") for i in range(3)]
    assert len({shard_of(s) for s in sessions}) == 3
    for n, session in enumerate(sessions):
        stale = LeaseToken(session=session, epoch=7, token="7:gone")  # no lease is held: every write is refused
        for _ in range(n + 1):
            with pytest.raises(FencedWriteError):
                await fenced_xadd(async_redis, stale, SessionKeys(session).events, {"type": "x"}, 100)
    per_shard = [int(await async_redis.hget(SessionKeys(s).fenced_rejections, FENCED_FIELD) or 0) for s in sessions]
    assert per_shard == [1, 2, 3]
    assert await fenced_total(async_redis) == 6 and (await read_stats(async_redis)).fenced_rejections == 6
