"""Migration step: layout 1's deployment-wide indexes into the shards' copies (``ShardKeys``).

- ``sb:runnable``, ``sb:sessions``, ``sb:deferred`` (member: a session), ``sb:approvals:due`` and
  ``sb:approvals:pending:<tenant>`` (member: ``<session>|<approval id>``): each member into its session's shard's
  copy, score kept.
- ``sb:effects:doubt:<tenant>`` (field: ``<session>|<effect key>``): each field into its session's shard's copy.
- ``sb:stats:counters``, ``sb:stats:hist:<name>`` and ``sb:stats:fenced``: added into shard 0's copies (the readers
  sum every shard's; the fenced count becomes the field ``fenced_rejections``).
- ``sb:deadletters``: each entry into its session's shard's stream under its own id (so the order is kept and a
  requeue finds it in the shard it reads), then the old stream is removed.

Idempotent and resumable: a member or field moves with its removal from the old key in one ``MULTI`` (a rerun finds
only what is left); counters move with the old key's deletion in one ``MULTI``; stream entries keep their ids, so an
entry a shard already holds (its id not above the shard's last) is skipped on a rerun. Runs offline on the single node.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from typing import Any, Final

import redis

from switchboard.queue.keys import FENCED_FIELD, Layout1Keys, SessionKeys, ShardKeys
from switchboard.types import SessionKey

__all__ = ["legacy", "step"]

BATCH: Final = 500
"""Members, fields or entries moved per round trip."""
_OLD = Layout1Keys()
_FIRST = ShardKeys.every()[0]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _shard(session: str) -> ShardKeys:
    return SessionKeys(SessionKey(session)).shard


def _by_member(member: str) -> ShardKeys:
    return _shard(member)


def _by_approval(member: str) -> ShardKeys:
    return _shard(member.rpartition("|")[0])


def _pending(tenant: str) -> Callable[[ShardKeys], str]:
    return lambda shard: shard.approvals_pending(tenant)


def _scan(r: redis.Redis, pattern: str) -> list[str]:
    return sorted({_text(k) for k in r.scan_iter(match=pattern, count=1000)})


def _move_zset(
    r: redis.Redis, old: str, new_of: Callable[[ShardKeys], str], shard_of: Callable[[str], ShardKeys]
) -> int:
    """Every member of ZSET ``old`` into ``new_of(its shard)``, score kept; returns how many moved."""
    moved = 0
    while batch := _zrange(r, old):
        with r.pipeline(transaction=True) as tx:
            for member, score in batch:
                tx.zadd(new_of(shard_of(_text(member))), {member: score})
            tx.zrem(old, *(member for member, _ in batch))
            tx.execute()
        moved += len(batch)
    return moved


def _zrange(r: redis.Redis, key: str) -> list[tuple[bytes, float]]:
    found: Any = r.zrange(key, 0, BATCH - 1, withscores=True)
    return list(found)


def _doubt_session(field: str, raw: bytes) -> str:
    try:
        entry = json.loads(raw)
    except ValueError:
        entry = None
    if isinstance(entry, dict) and isinstance(entry.get("session"), str):
        return str(entry["session"])
    return field.partition("|")[0]


def _move_doubts(r: redis.Redis, old: str, tenant: str) -> int:
    """Every field of one tenant's effects-in-doubt HASH into its session's shard's copy."""
    moved = 0
    while r.exists(old):
        cursor = 0
        while True:
            scanned: Any = r.hscan(old, cursor, count=BATCH)
            cursor, page = scanned
            if page:
                with r.pipeline(transaction=True) as tx:
                    for field, raw in page.items():
                        target = _shard(_doubt_session(_text(field), raw)).effects_in_doubt(tenant)
                        tx.hset(target, field, raw)
                    tx.hdel(old, *page)
                    tx.execute()
                moved += len(page)
            if not int(cursor):
                break
    return moved


def _add_counts(tx: Any, target: str, raw: dict[bytes, bytes]) -> None:
    for field, value in raw.items():
        text = _text(value)
        try:
            tx.hincrby(target, field, int(text))
        except ValueError:
            tx.hincrbyfloat(target, field, float(text))


def _fold_counts(r: redis.Redis, old: str, target: str) -> bool:
    """HASH ``old``'s counts added into ``target``, and ``old`` deleted, in one step; whether there was one."""
    raw: dict[bytes, bytes] = r.hgetall(old)  # type: ignore[assignment]
    if not raw:
        return False
    with r.pipeline(transaction=True) as tx:
        _add_counts(tx, target, raw)
        tx.delete(old)
        tx.execute()
    return True


def _fold_fenced(r: redis.Redis, old: str, target: str) -> int:
    """STRING counter ``old`` added into ``target``'s fenced field and deleted in one step; the count moved."""
    value = r.get(old)
    if value is None:
        return 0
    count = int(_text(value) or 0)
    with r.pipeline(transaction=True) as tx:
        tx.hincrby(target, FENCED_FIELD, count)
        tx.delete(old)
        tx.execute()
    return count


def _entry_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _dead_letter_shard(fields: dict[bytes, bytes]) -> ShardKeys:
    try:
        session = json.loads(fields.get(b"record", b"{}")).get("session")
    except (ValueError, AttributeError):
        session = None
    return _shard(session) if isinstance(session, str) and session else _FIRST


def _xrange(r: redis.Redis, start: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
    found: Any = r.xrange(_OLD.dead_letters, start, "+", count=BATCH)
    return list(found)


def _move_dead_letters(r: redis.Redis) -> int:
    """Every entry of the old dead-letter stream into its session's shard's stream, same id; then the old removed."""
    last: dict[ShardKeys, tuple[int, int]] = {}

    def top(shard: ShardKeys) -> tuple[int, int]:
        if shard not in last:
            newest: Any = r.xrevrange(shard.dead_letters, count=1)
            last[shard] = _entry_id(_text(newest[0][0])) if newest else (0, 0)
        return last[shard]

    copied = 0
    start = "-"
    while entries := _xrange(r, start):
        with r.pipeline(transaction=False) as pipe:
            for raw_id, fields in entries:
                entry_id, shard = _text(raw_id), _dead_letter_shard(fields)
                if _entry_id(entry_id) <= top(shard):
                    continue  # copied by an earlier run
                pipe.xadd(shard.dead_letters, fields, id=entry_id)  # type: ignore[arg-type]
                last[shard] = _entry_id(entry_id)
                copied += 1
            pipe.execute()
        start = f"({_text(entries[-1][0])}"
    r.delete(_OLD.dead_letters)
    return copied


_FAMILIES: Final = (
    (_OLD.runnable, "runnable sessions to move"),
    (_OLD.sessions, "session index entries to move"),
    (_OLD.deferred, "deferred sessions to move"),
    (_OLD.approvals_due, "approval indexes to move"),
    (_OLD.approvals_pending(""), "approval indexes to move"),
    (_OLD.effects_in_doubt(""), "effects in doubt to move"),
    (_OLD.stats, "counters to fold"),
    (_OLD.histogram(""), "counters to fold"),
    (_OLD.fenced_rejections, "counters to fold"),
    (_OLD.dead_letters, "dead-letter streams to move"),
)


def legacy(key: str) -> str | None:
    """The tally label of a layout-1 index this step moves, else ``None`` (exact names, or a family's head)."""
    for old, label in _FAMILIES:
        if key == old or (old.endswith(":") and key.startswith(old)):
            return label
    return None


def step(r: redis.Redis, tally: collections.Counter[str]) -> None:
    """Move layout 1's global indexes into the shards' copies (see the module's docstring)."""
    tally["runnable sessions moved"] += _move_zset(r, _OLD.runnable, lambda s: s.runnable, _by_member)
    tally["sessions moved"] += _move_zset(r, _OLD.sessions, lambda s: s.sessions, _by_member)
    tally["deferred sessions moved"] += _move_zset(r, _OLD.deferred, lambda s: s.deferred, _by_member)
    tally["approvals due moved"] += _move_zset(r, _OLD.approvals_due, lambda s: s.approvals_due, _by_approval)
    head = _OLD.approvals_pending("")
    for old in _scan(r, _OLD.family("approvals:pending:")):
        tenant = old[len(head) :]
        tally["pending approvals moved"] += _move_zset(r, old, _pending(tenant), _by_approval)
    head = _OLD.effects_in_doubt("")
    for old in _scan(r, _OLD.family("effects:doubt:")):
        tally["effects in doubt moved"] += _move_doubts(r, old, old[len(head) :])
    tally["stats hashes folded"] += _fold_counts(r, _OLD.stats, _FIRST.stats)
    head = _OLD.histogram("")
    for old in _scan(r, _OLD.family("stats:hist:")):
        tally["histograms folded"] += _fold_counts(r, old, _FIRST.histogram(old[len(head) :]))
    tally["fenced writes folded"] += _fold_fenced(r, _OLD.fenced_rejections, _FIRST.stats)
    tally["dead letters moved"] += _move_dead_letters(r)
