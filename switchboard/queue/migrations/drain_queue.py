"""Migration step: rq's drain jobs (layout 1) become drain entries on the sessions' shard queues (layout 2).

Runs after the steps that rename the session keys (``sb:{<shard tag>}:<<session>>:<name>``) and move the global
indexes to their shards. Offline, on one node, with no worker running: every key rq kept (its queue, intermediate list,
registries and job hashes, under ``RQ_KEY_PREFIX``, ``rq`` unless set) is deleted, every session's lease and drain
flag is cleared (nothing runs while migrating), and every session with messages waiting gets a new drain entry on its
shard's queue and its runnable mark, what the reaper does for a stranded session. Idempotent and resumable: a session
whose flag names an entry its shard's queue holds is done; each session is moved in one ``MULTI``.
"""

from __future__ import annotations

import collections
import os

import redis

from switchboard.queue.jobs import entry, new_job_id
from switchboard.queue.keys import GlobalKeys, Layout1Keys, SessionKeys, session_in
from switchboard.types import SessionKey

__all__ = ["legacy", "step"]

_GLOBAL = GlobalKeys()
_SCAN_COUNT = 1_000


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _rq_prefix() -> str:
    return os.environ.get("RQ_KEY_PREFIX", "rq")


def legacy(key: str) -> str | None:
    """The tally label of a layout-1 key this step deletes (rq's, under ``RQ_KEY_PREFIX``), else ``None``."""
    return "rq keys to delete" if key.startswith(f"{_rq_prefix()}:") else None


def step(r: redis.Redis, tally: collections.Counter[str]) -> None:
    """Drop rq's keys; queue a drain for every session with an inbox, with no lease or stale flag left."""
    rq_keys = [_text(k) for k in r.scan_iter(match=Layout1Keys.rq(_rq_prefix()))]
    for start in range(0, len(rq_keys), 500):
        tally["rq keys deleted"] += int(r.delete(*rq_keys[start : start + 500]))
    sessions = sorted(
        {
            SessionKey(s)
            for k in r.scan_iter(match=_GLOBAL.every_session, count=_SCAN_COUNT)
            if (s := session_in(_text(k)))
        }
    )
    for session in sessions:
        _queue_drain(r, session, tally)


def _queue_drain(r: redis.Redis, session: SessionKey, tally: collections.Counter[str]) -> None:
    keys = SessionKeys(session)
    flag, waiting = r.get(keys.drain), r.llen(keys.inbox)
    if flag is not None and waiting and r.lpos(keys.shard.drainq, entry(session, _text(flag))) is not None:
        tally["sessions already queued"] += 1
        return
    seconds, micros = r.time()
    with r.pipeline(transaction=True) as tx:
        if waiting:  # the flag names the new entry; KEEPTTL: a web chat session's keys keep their idle TTL
            job_id = new_job_id()
            tx.delete(keys.lease)
            tx.set(keys.drain, job_id, keepttl=True)
            tx.zadd(keys.shard.runnable, {session: seconds * 1000 + micros // 1000}, nx=True)  # ms, as ingest writes
            tx.rpush(keys.shard.drainq, entry(session, job_id))
        else:
            tx.delete(keys.lease, keys.drain)
        cleared, *_ = tx.execute()
    tally["leases and drain flags cleared" if not waiting else "leases cleared"] += int(cleared)
    if waiting:
        tally["drains queued"] += 1
