"""``switchboard migrate``: move the data of the release before the sharded layout to layout 2, and the layout check.

Layout 1 (no ``sb:layout`` key) kept a session's keys under the session itself as hash tag and a few counters and
indexes global; layout 2 puts them under the session's logical shard (:mod:`switchboard.queue.shards`). Code of one
layout sees nothing of the other's data, so:

- :func:`check_layout` runs once when ``switchboard web``, ``worker``, ``run`` and ``discord`` start: layout 2 goes
  on; an empty database is stamped ``2``; layout-1 data, a migration left half done or a newer layout stop the
  process with a :class:`~switchboard.errors.LayoutError` saying what to do.
- :func:`migrate` runs every :data:`STEPS` in order on a stopped deployment (``sb:layout = migrating`` meanwhile,
  ``2`` at the end). A step is ``step(r, tally)`` on a sync client of the one node, idempotent and resumable: a
  crash anywhere, then a rerun, ends in the same state, with nothing moved twice.
- Each step module also names its layout-1 keys (``legacy(key)``: a label for a key it would move, else ``None``):
  :func:`check_layout` looks for one, ``migrate --dry-run`` counts them. A step that adds a family adds its
  ``legacy`` to :data:`LEGACY` too.

docs/operations/production.md ("Upgrading to the sharded layout") is the operator's side.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import redis

from switchboard.errors import LayoutError
from switchboard.queue.connection import SyncClient
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.migrations import drain_queue, sessions, shard_indexes, tenant_tags

__all__ = [
    "LAYOUT",
    "LEGACY",
    "MIGRATING",
    "STEPS",
    "UPGRADE_DOCS",
    "Legacy",
    "Step",
    "check_layout",
    "find_legacy",
    "live_workers",
    "migrate",
    "read_layout",
    "survey",
]

LAYOUT = 2
"""The key layout this release reads and writes."""

MIGRATING = "migrating"
"""``sb:layout`` while ``switchboard migrate`` runs (or after it stopped half-way: run it again)."""

UPGRADE_DOCS = "docs/operations/production.md (Upgrading to the sharded layout)"
"""Where the operator reads how to upgrade; named in every refusal."""

Step = Callable[[redis.Redis, collections.Counter[str]], None]
"""One migration step: moves its keys on the node, adding what it did to the tally."""

Legacy = Callable[[str], str | None]
"""A step's recogniser of layout-1 keys: the tally label of a key it would move, else ``None``."""

STEPS: tuple[Step, ...] = (sessions.step, shard_indexes.step, tenant_tags.step, drain_queue.step)
"""Every step, in order: sessions → shard indexes → tenant tags → drain queue."""

LEGACY: tuple[Legacy, ...] = (sessions.legacy, shard_indexes.legacy, tenant_tags.legacy, drain_queue.legacy)
"""Every step's recogniser of the layout-1 keys it moves."""

_GLOBAL = GlobalKeys()
_SCAN_COUNT = 1000


def read_layout(r: SyncClient) -> str | None:
    """What ``sb:layout`` holds (``None``: absent)."""
    value = r.get(_GLOBAL.layout)
    return value.decode() if isinstance(value, bytes) else value


def _label(key: bytes | str) -> str | None:
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    for legacy in LEGACY:
        if (label := legacy(text)) is not None:
            return label
    return None


def find_legacy(r: SyncClient) -> str | None:
    """A layout-1 key in the database, or ``None`` when it holds none (one ``SCAN``, stopping at the first).

    Every key is looked at, not only ``sb:*`` ones: a step may move keys of another prefix (rq's).
    """
    for key in r.scan_iter(count=_SCAN_COUNT):
        if _label(key) is not None:
            return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    return None


def survey(r: redis.Redis) -> collections.Counter[str]:
    """How many layout-1 keys each step would move, by label (what ``migrate --dry-run`` prints); reads only."""
    tally: collections.Counter[str] = collections.Counter()
    for key in r.scan_iter(count=_SCAN_COUNT):
        if (label := _label(key)) is not None:
            tally[label] += 1
    return tally


def live_workers(r: redis.Redis) -> list[str]:
    """The workers whose liveness key still exists (a worker of either layout: the keys did not change)."""
    members = [m.decode() if isinstance(m, bytes) else str(m) for m in r.zrange(_GLOBAL.workers, 0, -1)]
    if not members:
        return []
    with r.pipeline(transaction=False) as pipe:
        for worker in members:
            pipe.exists(_GLOBAL.worker_alive(worker))
        alive = pipe.execute()
    return [worker for worker, exists in zip(members, alive, strict=True) if exists]


def _refusal(layout: str | None, role: str) -> LayoutError:
    if layout == MIGRATING:
        return LayoutError(
            f"`switchboard {role}` refuses to start: a migration to layout {LAYOUT} was started and did not finish. "
            f"Run `switchboard migrate` again (it resumes); see {UPGRADE_DOCS}",
            layout=layout,
        )
    if layout is not None and layout.isdigit() and int(layout) > LAYOUT:
        return LayoutError(
            f"`switchboard {role}` refuses to start: the data is in key layout {layout}, newer than this release's "
            f"({LAYOUT}). Upgrade Switchboard to the release that wrote it",
            layout=layout,
        )
    if layout is None:
        return LayoutError(
            f"`switchboard {role}` refuses to start: Redis holds data of the release before the sharded key layout, "
            f"which this release cannot read. Stop every web and worker process of the old release, back up, run "
            f"`switchboard migrate`, then start this release; see {UPGRADE_DOCS}",
            layout=layout,
        )
    return LayoutError(
        f"`switchboard {role}` refuses to start: sb:layout holds {layout!r}, not a layout this release knows "
        f"(it reads layout {LAYOUT}); see {UPGRADE_DOCS}",
        layout=layout,
    )


def check_layout(r: SyncClient, role: str) -> None:
    """Refuse to start on data this release cannot read; stamp an empty database with :data:`LAYOUT`.

    One ``GET`` when the data is stamped (every start but the first); the first start on an unstamped database also
    scans it once for layout-1 keys.

    Args:
        r: a client of the deployment's Redis (one server or a cluster: its ``SCAN`` visits every primary).
        role: the starting command (``web``, ``worker``…), for the message.

    Raises:
        LayoutError: layout-1 data, a migration not finished, or a layout newer or unknown.
    """
    layout = read_layout(r)
    if layout == str(LAYOUT):
        return
    if layout is None and find_legacy(r) is None:
        # SET NX: two processes starting at once both stamp, or one finds the other's stamp
        r.set(_GLOBAL.layout, LAYOUT, nx=True)
        layout = read_layout(r)
        if layout == str(LAYOUT):
            return
    raise _refusal(layout, role)


def migrate(r: redis.Redis, *, dry_run: bool = False) -> collections.Counter[str]:
    """Move layout-1 data to layout :data:`LAYOUT`: every step in order, then ``sb:layout = 2``; the tally.

    Runs on a stopped deployment (the caller checks that no worker is alive). Resumes a migration that stopped
    half-way (``sb:layout = migrating``). ``dry_run`` writes nothing and tallies the layout-1 keys instead
    (:func:`survey`).

    Raises:
        LayoutError: the data is already at layout 2 (nothing to do), or in a layout newer or unknown.
    """
    layout = read_layout(r)
    if layout not in (None, MIGRATING):
        if layout == str(LAYOUT):
            raise LayoutError(f"the data is already in key layout {LAYOUT}: nothing to migrate", layout=layout)
        raise _refusal(layout, "migrate")
    if dry_run:
        return survey(r)
    tally: collections.Counter[str] = collections.Counter()
    r.set(_GLOBAL.layout, MIGRATING)
    for step in STEPS:
        step(r, tally)
    r.set(_GLOBAL.layout, LAYOUT)
    return tally
