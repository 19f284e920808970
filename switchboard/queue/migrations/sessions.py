"""Migration step: every session key to its shard-tagged name.

Layout 1 named a session's keys ``sb:{<session>}:<name>``; layout 2 names them ``sb:{<shard tag>}:<<session>>:<name>``
(:class:`~switchboard.queue.keys.SessionKeys`). On one node ``RENAME`` moves a key across slots with its value and
TTL, atomically, so a crash leaves each key under exactly one of its names and a rerun's ``SCAN`` finds only the
ones still to move.
"""

from __future__ import annotations

import collections

import redis

from switchboard.queue.keys import Layout1Keys, SessionKeys

__all__ = ["legacy", "rename_session_keys", "step"]

_OLD = Layout1Keys()
_PAGE = 500

RENAMED = "session keys renamed"
SESSIONS = "sessions moved"


def legacy(key: str) -> str | None:
    """The tally label of a layout-1 key this step moves, else ``None``."""
    return "session keys to rename" if Layout1Keys.session_in(key) is not None else None


def rename_session_keys(r: redis.Redis, tally: collections.Counter[str], *, limit: int | None = None) -> None:
    """``RENAME`` every layout-1 session key to its layout-2 name (``limit``: stop after that many, for tests).

    Raises:
        RuntimeError: a key's new name is taken already (layout-2 code wrote there): nothing is overwritten; the
            migration stops with the layout still ``migrating``.
    """
    sessions: set[str] = set()
    page: list[tuple[bytes, str]] = []

    def flush() -> None:
        with r.pipeline(transaction=False) as pipe:
            for old, new in page:
                pipe.renamenx(old, new)
            results = pipe.execute(raise_on_error=False)
        for (old, new), result in zip(page, results, strict=True):
            if isinstance(result, redis.ResponseError):  # expired since the scan saw it ("no such key")
                continue
            if not result:
                raise RuntimeError(f"cannot rename {old.decode()!r}: {new!r} exists already; nothing was overwritten")
            tally[RENAMED] += 1
        page.clear()

    moved = 0
    for key in r.scan_iter(match=_OLD.every_session, count=_PAGE):
        found = Layout1Keys.session_in(key.decode("utf-8", "replace"))
        if found is None:
            continue
        session, name = found
        new = SessionKeys(session).key(name)
        page.append((key, new))
        sessions.add(session)
        moved += 1
        if len(page) >= _PAGE:
            flush()
        if limit is not None and moved >= limit:
            break
    if page:
        flush()
    tally[SESSIONS] += len(sessions)


def step(r: redis.Redis, tally: collections.Counter[str]) -> None:
    """The session step of ``switchboard migrate``: every session key renamed."""
    rename_session_keys(r, tally)
