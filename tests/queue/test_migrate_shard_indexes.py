"""The migration step that moves layout 1's global indexes into the shards' copies, on the real embedded server."""

from __future__ import annotations

import collections
import json

import redis

from switchboard.core.messages import session_key
from switchboard.queue.approvals import approval_member
from switchboard.queue.effects import doubt_field
from switchboard.queue.keys import FENCED_FIELD, Layout1Keys, SessionKeys, ShardKeys
from switchboard.queue.migrations import STEPS, shard_indexes
from switchboard.queue.shards import shard_of

OLD = Layout1Keys()
SESSIONS = [session_key("acme", "assistant", "telegram", "bot1", f"chat-{i}") for i in range(40)]
OTHER = session_key("beta", "assistant", "web", "w", "c9")


def _fill(r: redis.Redis) -> None:
    """A layout-1 data set as the current release writes it."""
    r.zadd(OLD.sessions, {s: 1_000 + i for i, s in enumerate(SESSIONS)} | {OTHER: 5})
    r.zadd(OLD.runnable, {s: 2_000 + i for i, s in enumerate(SESSIONS[:10])})
    r.zadd(OLD.deferred, {SESSIONS[3]: 9_999.5})
    r.zadd(OLD.approvals_due, {approval_member(SESSIONS[1], "ap1"): 50.0, approval_member(OTHER, "ap2"): 60.0})
    r.zadd(OLD.approvals_pending("acme"), {approval_member(SESSIONS[1], "ap1"): 40.0})
    r.zadd(OLD.approvals_pending("beta"), {approval_member(OTHER, "ap2"): 41.0})
    for session in (SESSIONS[2], SESSIONS[5]):
        entry = {"session": session, "key": "k|1", "at": 7.0}
        r.hset(OLD.effects_in_doubt("acme"), doubt_field(session, "k|1"), json.dumps(entry))
    r.hset(OLD.stats, mapping={"accepted": 41, "credits": "1.25", 'seg:["turn","a","v","acme","le:1"]': 3})
    r.hset(OLD.histogram("run"), mapping={"le:1": 4, "le:+Inf": 5, "sum": "6.5"})
    r.hset(OLD.histogram("queue_wait"), mapping={"le:0.01": 2})
    r.set(OLD.fenced_rejections, 7)
    for i in range(30):
        record = {"session": SESSIONS[i % 4], "message_ids": [f"m{i}"], "reason": "boom", "at": float(i)}
        r.xadd(OLD.dead_letters, {"record": json.dumps(record)}, id=f"{1_000 + i}-0")


def _old_keys(r: redis.Redis) -> list[bytes]:
    return sorted(k for k in r.scan_iter(match="sb:[^{]*", count=1000))


def test_the_step_moves_every_index_into_its_shards_copy_and_a_rerun_changes_nothing(sync_redis: redis.Redis) -> None:
    _fill(sync_redis)
    dead_before = [(i, f) for i, f in sync_redis.xrange(OLD.dead_letters)]
    assert len(_old_keys(sync_redis)) == 12
    tally: collections.Counter[str] = collections.Counter()
    shard_indexes.step(sync_redis, tally)

    assert _old_keys(sync_redis) == []
    assert tally["sessions moved"] == 41 and tally["runnable sessions moved"] == 10
    assert tally["dead letters moved"] == 30 and tally["fenced writes folded"] == 7
    for i, session in enumerate(SESSIONS):
        shard = SessionKeys(session).shard
        assert sync_redis.zscore(shard.sessions, session) == 1_000 + i
        assert sync_redis.zscore(shard.runnable, session) == (2_000 + i if i < 10 else None)
    assert sync_redis.zscore(SessionKeys(SESSIONS[3]).shard.deferred, SESSIONS[3]) == 9_999.5
    one, other = SessionKeys(SESSIONS[1]).shard, SessionKeys(OTHER).shard
    assert sync_redis.zrange(one.approvals_due, 0, -1, withscores=True) == [(b"%s|ap1" % SESSIONS[1].encode(), 50.0)]
    assert sync_redis.zscore(other.approvals_due, approval_member(OTHER, "ap2")) == 60.0
    assert sync_redis.zscore(one.approvals_pending("acme"), approval_member(SESSIONS[1], "ap1")) == 40.0
    assert sync_redis.zscore(other.approvals_pending("beta"), approval_member(OTHER, "ap2")) == 41.0
    for session in (SESSIONS[2], SESSIONS[5]):
        raw = sync_redis.hget(SessionKeys(session).shard.effects_in_doubt("acme"), doubt_field(session, "k|1"))
        assert raw is not None and json.loads(raw)["session"] == session
    first = ShardKeys.every()[0]
    counters = sync_redis.hgetall(first.stats)
    assert counters[b"accepted"] == b"41" and float(counters[b"credits"]) == 1.25
    assert counters[FENCED_FIELD.encode()] == b"7"
    assert sync_redis.hgetall(first.histogram("run")) == {b"le:1": b"4", b"le:+Inf": b"5", b"sum": b"6.5"}
    # each dead letter in its session's shard, under its own id: every shard's stream in the old order
    moved = {}
    for session in SESSIONS[:4]:
        shard = SessionKeys(session).shard
        moved |= {i: f for i, f in sync_redis.xrange(shard.dead_letters)}
    assert sorted(moved.items()) == dead_before

    snapshot = {k: sync_redis.dump(k) for k in sync_redis.scan_iter(count=1000)}
    again: collections.Counter[str] = collections.Counter()
    shard_indexes.step(sync_redis, again)
    assert +again == collections.Counter()
    assert {k: sync_redis.dump(k) for k in sync_redis.scan_iter(count=1000)} == snapshot


def test_a_rerun_after_a_crash_mid_stream_copies_no_entry_twice(sync_redis: redis.Redis) -> None:
    _fill(sync_redis)
    entries = sync_redis.xrange(OLD.dead_letters)
    for raw_id, fields in entries[:11]:  # a first run copied these, then died before removing the old stream
        record = json.loads(fields[b"record"])
        sync_redis.xadd(SessionKeys(record["session"]).shard.dead_letters, fields, id=raw_id)
    tally: collections.Counter[str] = collections.Counter()
    shard_indexes.step(sync_redis, tally)
    assert tally["dead letters moved"] == 19
    shards = {SessionKeys(s).shard for s in SESSIONS[:4]}
    assert sum(sync_redis.xlen(s.dead_letters) for s in shards) == 30 and not sync_redis.exists(OLD.dead_letters)


def test_the_step_is_in_the_migration_steps() -> None:
    assert shard_indexes.step in STEPS
    assert len({shard_of(s) for s in SESSIONS}) > 30  # the sessions really are spread
