"""The session step and the layout check on the real embedded server, with layout-1 keys written directly."""

from __future__ import annotations

import collections

import pytest
import redis

from switchboard.errors import LayoutError
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.migrations import check_layout, find_legacy, migrate, read_layout
from switchboard.queue.migrations.sessions import step
from switchboard.types import SessionKey

SESSION = SessionKey("acme/assistant/telegram/main/42")
THREAD = SessionKey("acme/assistant/slack/main/C1%3AX/1700000000.0001")  # six components, an escaped ':' and a '.'
LAYOUT = GlobalKeys().layout

# keys that are no session's and that no step moves (other steps' layout-1 keys are in their own tests)
NOT_SESSIONS = (
    "sb:{budget:acme}:counters",
    "sb:{rate:telegram/main}:send",
    "sb:{rate:telegram/main}:send:42",
    "sb:{people:acme}:log",
    "sb:{listener:telegram/main}:lease",
    "sb:{schedules}:due",
    "sb:{review:acme}:runs",
    "sb:{rq}:whatever",
    "sb:{a/b/c/d}:four-components",
    "sb:{a/b/c/d/e/f/g}:seven-components",
)


def _old(session: str, name: str) -> str:
    return f"sb:{{{session}}}:{name}"


def _fill(r: redis.Redis) -> None:
    r.rpush(_old(SESSION, "inbox"), "m1", "m2")
    r.hset(_old(SESSION, "messages"), mapping={"m1": "{}", "m2": "{}"})
    r.set(_old(SESSION, "dedup:update:7"), "m1", ex=3600)
    r.set(_old(SESSION, "epoch"), 4)
    r.rpush(_old(THREAD, "history"), "h1")
    r.hset(_old(THREAD, "approval:abc"), "status", "pending")
    for key in NOT_SESSIONS:
        r.set(key, "x")


def test_the_step_renames_every_session_key_keeps_ttls_and_leaves_other_keys(sync_redis: redis.Redis) -> None:
    _fill(sync_redis)
    tally: collections.Counter[str] = collections.Counter()
    step(sync_redis, tally)
    assert tally == {"session keys renamed": 6, "sessions moved": 2}
    new, thread = SessionKeys(SESSION), SessionKeys(THREAD)
    assert sync_redis.lrange(new.inbox, 0, -1) == [b"m1", b"m2"]
    assert sync_redis.hgetall(new.messages) == {b"m1": b"{}", b"m2": b"{}"}
    assert 3500 < sync_redis.ttl(new.dedup("update:7")) <= 3600
    assert sync_redis.get(new.epoch) == b"4"
    assert sync_redis.lrange(thread.history, 0, -1) == [b"h1"]
    assert sync_redis.hget(thread.approval("abc"), "status") == b"pending"
    assert all(sync_redis.get(key) == b"x" for key in NOT_SESSIONS)
    keys = {k.decode() for k in sync_redis.scan_iter()}
    assert not [k for k in keys if k.startswith((f"sb:{{{SESSION}}}", f"sb:{{{THREAD}}}"))]

    again: collections.Counter[str] = collections.Counter()
    step(sync_redis, again)  # idempotent: nothing left to move, nothing counted twice
    assert again == {"sessions moved": 0}
    assert {k.decode() for k in sync_redis.scan_iter()} == keys


def test_a_taken_new_name_stops_the_step_without_overwriting(sync_redis: redis.Redis) -> None:
    sync_redis.rpush(_old(SESSION, "inbox"), "old")
    sync_redis.rpush(SessionKeys(SESSION).inbox, "new")
    with pytest.raises(RuntimeError, match="exists already"):
        step(sync_redis, collections.Counter())
    assert sync_redis.lrange(SessionKeys(SESSION).inbox, 0, -1) == [b"new"]
    assert sync_redis.lrange(_old(SESSION, "inbox"), 0, -1) == [b"old"]


def test_check_layout_stamps_an_empty_database_and_one_with_only_this_layouts_data(sync_redis: redis.Redis) -> None:
    check_layout(sync_redis, "worker")
    assert read_layout(sync_redis) == "2"
    sync_redis.flushall()
    sync_redis.rpush(SessionKeys(SESSION).inbox, "m1")  # written before any start
    for key in NOT_SESSIONS:
        sync_redis.set(key, "x")
    check_layout(sync_redis, "web")
    assert read_layout(sync_redis) == "2"
    check_layout(sync_redis, "web")  # stamped: goes on


@pytest.mark.parametrize(
    ("layout", "legacy", "says"),
    [
        (None, _old(SESSION, "inbox"), "`switchboard migrate`"),
        (None, "sb:stats:fenced", "`switchboard migrate`"),
        ("migrating", None, "did not finish"),
        ("3", None, "newer than this release's (2). Upgrade Switchboard"),
        ("banana", None, "not a layout this release knows"),
    ],
)
def test_check_layout_refuses_what_it_cannot_read(
    sync_redis: redis.Redis, layout: str | None, legacy: str | None, says: str
) -> None:
    if layout is not None:
        sync_redis.set(LAYOUT, layout)
    if legacy is not None:
        sync_redis.set(legacy, "1")
    with pytest.raises(LayoutError, match=says.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        check_layout(sync_redis, "worker")
    assert read_layout(sync_redis) == layout


def test_migrate_runs_on_old_data_once_and_then_refuses(sync_redis: redis.Redis) -> None:
    _fill(sync_redis)
    assert find_legacy(sync_redis) is not None
    tally = migrate(sync_redis)
    assert tally["session keys renamed"] == 6 and read_layout(sync_redis) == "2"
    assert find_legacy(sync_redis) is None
    with pytest.raises(LayoutError, match="already in key layout 2"):
        migrate(sync_redis)
    sync_redis.set(LAYOUT, "3")
    with pytest.raises(LayoutError, match="newer"):
        migrate(sync_redis)
