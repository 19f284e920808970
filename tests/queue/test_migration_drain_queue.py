"""The drain-queue migration step on the real embedded server: rq's drain jobs become per-shard drain entries."""

from __future__ import annotations

import collections

import redis
import redis.asyncio as aioredis

from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import DrainJobs, entry, parse_entry
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.migrations import STEPS, drain_queue
from switchboard.queue.shards import shard_of
from switchboard.settings import QueueSettings
from switchboard.worker.drainturn import DrainOutcome

from .conftest import RecordingDeliverer, make_drainer, make_message

_G = GlobalKeys()


async def _layout1(r: redis.Redis, ingestor: Ingestor) -> tuple[list[str], str, str]:
    """What the current release leaves: rq's queue, registries and job hashes; sessions with messages waiting (one
    mid-turn: a lease and a started job), one drained (a stale flag), keys already renamed by the earlier steps.

    The sessions' messages are ingested for real, then their drain entries replaced by layout 1's rq jobs.
    """
    waiting = [make_message(f"w{i}", conversation=f"waiting{i}").session_key for i in range(3)]
    running = make_message("r", conversation="running").session_key
    drained = make_message("d", conversation="drained").session_key
    for n, session in enumerate([*waiting, running]):
        conversation = "running" if session == running else f"waiting{n}"
        for i in range(2):
            await ingestor.ingest(make_message(f"{conversation}-{i}", conversation=conversation))
        keys = SessionKeys(session)
        r.delete(keys.shard.drainq)
        r.set(keys.drain, f"d00000000000{n}aaaaaaaaaaaa")
        r.hset(f"rq:job:d00000000000{n}aaaaaaaaaaaa", mapping={"status": "queued", "description": f"drain {session}"})
    r.zrem(SessionKeys(waiting[0]).shard.runnable, waiting[0])  # the step puts it back
    r.set(SessionKeys(running).lease, "7:old-worker", px=600_000)
    r.rpush("rq:queue:switchboard", *(f"d00000000000{n}aaaaaaaaaaaa" for n in range(3)))
    r.rpush("rq:queue:switchboard:intermediate", "d000000000003aaaaaaaaaaaa")
    r.zadd("rq:wip:switchboard", {"d000000000003aaaaaaaaaaaa:abc": 1e10})
    r.zadd("rq:failed:switchboard", {"d0000000000ffaaaaaaaaaaaa": 1e10})
    r.sadd("rq:queues", "rq:queue:switchboard")
    r.set(SessionKeys(drained).drain, "d0000000000eeaaaaaaaaaaaa")  # a drained session's stale flag
    r.set(SessionKeys(drained).meta, "kept")
    return [*waiting, running], drained, running


def test_the_step_is_listed() -> None:
    assert drain_queue.step in STEPS


async def test_rq_jobs_become_shard_entries_twice_over_and_drain_in_order(
    sync_redis: redis.Redis, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    queued, drained, running = await _layout1(sync_redis, ingestor)
    tally: collections.Counter[str] = collections.Counter()
    drain_queue.step(sync_redis, tally)
    assert tally["drains queued"] == 4 and tally["rq keys deleted"] == 9
    first = {s: sync_redis.get(SessionKeys(s).drain) for s in queued}
    again: collections.Counter[str] = collections.Counter()
    drain_queue.step(sync_redis, again)  # a rerun (or a resumed crash) moves nothing twice
    assert again == collections.Counter({"sessions already queued": 4})
    assert {s: sync_redis.get(SessionKeys(s).drain) for s in queued} == first

    assert list(sync_redis.scan_iter(match="rq:*")) == []
    assert not sync_redis.exists(SessionKeys(running).lease, SessionKeys(drained).drain)
    assert sync_redis.get(SessionKeys(drained).meta) == b"kept"
    for session in queued:
        keys = SessionKeys(session)
        flag = (sync_redis.get(keys.drain) or b"").decode()
        assert [e.decode() for e in sync_redis.lrange(keys.shard.drainq, 0, -1)] == [entry(session, flag)]
        assert (
            sync_redis.zscore(SessionKeys(session).shard.runnable, session) or 0
        ) > 1e12  # milliseconds, as ingest writes them
    assert sync_redis.zscore(SessionKeys(drained).shard.runnable, drained) is None

    # a worker's take finds each, and a drain answers the waiting messages in order, once
    deliverer = RecordingDeliverer(statuses=False)
    drainer = make_drainer(client, queue_settings, deliverer)
    for session in queued:
        job, _ = await DrainJobs().take(client, shard_of(session))
        assert job is not None and parse_entry(job.entry) == (session, job.job_id)
        assert await drainer.drain_session(session, job) is DrainOutcome.RELEASED
        assert not await client.exists(SessionKeys(session).inbox, SessionKeys(session).drain)
        assert await client.zscore(SessionKeys(session).shard.wip, job.entry) is None
    conversations = ["waiting0", "waiting1", "waiting2", "running"]
    assert deliverer.texts() == [f"echo: {c}-{i}" for c in conversations for i in range(2)]
