"""The retention sweep: removes what is older than its tenant's rule, per kind (:mod:`switchboard.core.retention`).

It runs in the workers (one at a time, under a Redis lock, every ``retention.every``) and from ``switchboard retention
run``. Each kind is removed where it lives: event logs by entry id time (``XTRIM MINID``), history entries and
dead letters by their own time, decided approval records (their snapshots are inside them) by when they were decided,
workspace files by modification time, memory and documents through the memory store's ``purge``. A kind without a
rule is not looked at. What was removed is counted per tenant and kind, never shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from redis.exceptions import WatchError

from switchboard.core.retention import RetentionConfig, RetentionKind
from switchboard.core.workspaces.disk import tenant_dir
from switchboard.core.workspaces.store import LocalWorkspaces
from switchboard.queue.approvals import record_from_fields
from switchboard.queue.fanout import each_shard
from switchboard.queue.keys import GlobalKeys, SessionKeys, ShardKeys, session_in, tenant_of
from switchboard.queue.store import parse_history
from switchboard.types import SessionKey

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.core.workspaces.store import WorkspaceStore

__all__ = ["PurgingMemory", "RetentionPlan", "RetentionReport", "RetentionSweep", "sweep_if_due"]

logger = logging.getLogger(__name__)

_KEYS = GlobalKeys()
_MEMORY_KINDS: tuple[tuple[RetentionKind, Literal["fact", "document"]], ...] = (
    ("memory", "fact"),
    ("knowledge", "document"),
)


class PurgingMemory(Protocol):
    """What the sweep needs of a memory store (part of :class:`~switchboard.core.memory.store.MemoryStore`)."""

    async def purge(self, tenant: str, before: float, *, kind: Literal["fact", "document"] | None = None) -> int:
        """Remove ``tenant``'s facts (or documents) created before ``before``; how many."""
        ...


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class RetentionReport:
    """What one sweep removed (or, dry, would remove): counts per tenant and kind."""

    dry_run: bool
    counts: Counter[tuple[str, RetentionKind]] = field(default_factory=Counter)
    not_counted: set[tuple[str, RetentionKind]] = field(default_factory=set)
    """Kinds a dry run cannot count (the memory store removes without listing first)."""

    def lines(self) -> list[str]:
        """The report as the CLI prints it: one line per tenant and kind with a rule."""
        verb = "would remove" if self.dry_run else "removed"
        tenants = sorted({tenant for tenant, _ in [*self.counts, *self.not_counted]})
        if not tenants:
            return ["no retention rule applies: nothing removed"]
        out: list[str] = []
        for tenant in tenants:
            out.append(f"tenant {tenant}: {verb}")
            kinds = sorted({kind for t, kind in [*self.counts, *self.not_counted] if t == tenant})
            for kind in kinds:
                shown = "not counted in a dry run" if (tenant, kind) in self.not_counted else self.counts[tenant, kind]
                out.append(f"  {kind}: {shown}")
        return out

    @property
    def total(self) -> int:
        """Everything removed, all tenants and kinds."""
        return sum(self.counts.values())


class RetentionSweep:
    """Applies ``config`` to the stores it is given; with ``dry_run`` it only counts."""

    def __init__(
        self,
        redis: aioredis.Redis,
        config: RetentionConfig,
        *,
        workspaces: WorkspaceStore | None = None,
        memory: PurgingMemory | None = None,
        tenants: Iterable[str] = (),
        dry_run: bool = False,
    ) -> None:
        self.redis = redis
        self.config = config
        self.workspaces = workspaces
        self.memory = memory
        self.known_tenants = set(tenants)
        """Tenants to look at beyond those with keys in Redis (projects' tenants, whose memory may outlive them)."""
        self.dry_run = dry_run

    async def _sessions(self) -> dict[str, dict[SessionKey, list[str]]]:
        """Tenant → its sessions → their approval keys, from one pass over the keyspace."""
        found: dict[str, dict[SessionKey, list[str]]] = defaultdict(dict)
        async for raw in self.redis.scan_iter(match=_KEYS.every_session, count=1000):
            key = _text(raw)
            session = session_in(key)
            if session is None:
                continue
            approvals = found[tenant_of(SessionKey(session))].setdefault(SessionKey(session), [])
            if key.startswith(SessionKeys(SessionKey(session)).approval("")):
                approvals.append(key)
        return found

    async def run(self, now: float | None = None) -> RetentionReport:
        """One sweep over every tenant with a rule."""
        now = time.time() if now is None else now
        report = RetentionReport(dry_run=self.dry_run)
        if not self.config.active:
            return report
        sessions = await self._sessions()
        for tenant in sorted(set(sessions) | self.known_tenants | set(self.config.tenants)):
            rules = self.config.rules(tenant)
            if not rules:
                continue
            for session, approvals in sorted(sessions.get(tenant, {}).items()):
                await self._session(tenant, session, approvals, rules, now, report)
            if (limit := rules.get("dead_letters")) is not None:
                await self._dead_stream(tenant, now - limit, report)
            if (limit := rules.get("workspaces")) is not None:
                await self._workspace_files(tenant, now - limit, report)
            for kind, stored in _MEMORY_KINDS:
                limit = rules.get(kind)
                if limit is None or self.memory is None:
                    continue
                if self.dry_run:
                    report.not_counted.add((tenant, kind))
                else:
                    report.counts[tenant, kind] += await self.memory.purge(tenant, now - limit, kind=stored)
        if not self.dry_run:  # once an interval: "removed 0" says the sweep ran
            logger.info("retention sweep removed %d entries: %s", report.total, dict(report.counts))
        return report

    async def _session(
        self,
        tenant: str,
        session: SessionKey,
        approvals: list[str],
        rules: dict[RetentionKind, float],
        now: float,
        report: RetentionReport,
    ) -> None:
        keys = SessionKeys(session)
        if (limit := rules.get("events")) is not None:
            report.counts[tenant, "events"] += await self._trim_stream(keys.events, now - limit)
        if (limit := rules.get("history")) is not None:
            report.counts[tenant, "history"] += await self._trim_history(session, now - limit)
        if (limit := rules.get("dead_letters")) is not None:
            report.counts[tenant, "dead_letters"] += await self._drop_listed(keys.dead, now - limit)
        if (limit := rules.get("approvals")) is not None:
            report.counts[tenant, "approvals"] += await self._approvals(approvals, now - limit)

    async def _trim_stream(self, key: str, before: float) -> int:
        """Entries of stream ``key`` older than ``before`` (by id time), removed with ``XTRIM MINID``."""
        cutoff_ms = int(before * 1000)
        if self.dry_run:
            old: Any = await self.redis.xrange(key, "-", f"{cutoff_ms - 1}-18446744073709551615")
            return len(old or [])
        return int(await self.redis.xtrim(key, minid=cutoff_ms, approximate=False))

    async def _trim_history(self, session: SessionKey, before: float) -> int:
        """History entries written before ``before``: the oldest first, so a prefix of the list (``LTRIM``)."""
        key = SessionKeys(session).history
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.lrange(key, 0, -1)
                    entries = parse_history(raw, session)
                    old = next((i for i, entry in enumerate(entries) if entry.at >= before), len(entries))
                    if old and not self.dry_run:
                        pipe.multi()  # type: ignore[no-untyped-call]
                        pipe.ltrim(key, old, -1)
                        await pipe.execute()
                    else:
                        await pipe.reset()  # type: ignore[no-untyped-call]
                    return old
                except WatchError:
                    continue

    async def _drop_listed(self, key: str, before: float) -> int:
        """Records of list ``key`` (JSON with ``at``) older than ``before``."""
        doomed: list[bytes | str] = []
        for raw in await self.redis.lrange(key, 0, -1):
            try:
                at = json.loads(raw).get("at")
            except (ValueError, AttributeError):
                continue
            if isinstance(at, int | float) and at < before:
                doomed.append(raw)
        if doomed and not self.dry_run:
            async with self.redis.pipeline(transaction=False) as pipe:
                for raw in doomed:
                    pipe.lrem(key, 1, raw)  # type: ignore[arg-type]
                await pipe.execute()
        return len(doomed)

    async def _dead_stream(self, tenant: str, before: float, report: RetentionReport) -> None:
        """The tenant's entries of the shards' dead-letter streams older than ``before`` (by id time).

        One pipeline reads every shard's old entries (each stream is short: ``SHARD_DEAD_LETTER_CAP``).
        """
        cutoff = f"{int(before * 1000) - 1}-18446744073709551615"
        streams = await each_shard(self.redis, lambda pipe, shard: pipe.xrange(shard.dead_letters, "-", cutoff))
        total = 0
        for shard, entries in zip(ShardKeys.every(), streams, strict=True):
            doomed = []
            for entry_id, fields in entries or []:
                try:
                    session = json.loads(fields.get(b"record", b"{}")).get("session", "")
                except (ValueError, AttributeError):
                    continue
                if isinstance(session, str) and tenant_of(SessionKey(session)) == tenant:
                    doomed.append(entry_id)
            total += len(doomed)
            if doomed and not self.dry_run:
                await self.redis.xdel(shard.dead_letters, *doomed)
        report.counts[tenant, "dead_letters"] += total

    async def _approvals(self, keys: list[str], before: float) -> int:
        """Decided approval records (with the paused program they hold) decided before ``before``; pending kept."""
        doomed: list[str] = []
        for key in keys:
            record = record_from_fields(await self.redis.hgetall(key))
            if record is None or record.status == "pending":
                continue
            # superseded without a decision: from when it was asked
            when = record.decided_at if record.decided_at is not None else record.requested_at
            if when < before:
                doomed.append(key)
        if doomed and not self.dry_run:
            await self.redis.delete(*doomed)
        return len(doomed)

    async def _workspace_files(self, tenant: str, before: float, report: RetentionReport) -> None:
        """Files of the tenant's local workspaces last modified before ``before`` (and directories left empty)."""
        if not isinstance(self.workspaces, LocalWorkspaces):
            return  # a remote store (S3) keeps objects under its own lifecycle rules
        home = tenant_dir(self.workspaces.root, f"{tenant}/-")
        removed = await asyncio.to_thread(_old_files, home, before, self.dry_run)
        report.counts[tenant, "workspaces"] += removed


def _old_files(home: Path, before: float, dry_run: bool) -> int:
    """Old files inside each session directory under ``home`` (the tenant's own bookkeeping files are left alone)."""
    if not home.is_dir():
        return 0
    removed = 0
    for workspace in (p for p in home.iterdir() if p.is_dir() and not p.is_symlink()):
        for root, dirs, files in os.walk(workspace, topdown=False):
            for name in files:
                path = Path(root) / name
                try:
                    if path.lstat().st_mtime < before:
                        removed += 1
                        if not dry_run:
                            path.unlink()
                except FileNotFoundError:
                    continue
            for name in dirs if not dry_run else ():
                with contextlib.suppress(OSError):
                    (Path(root) / name).rmdir()  # only when left empty
    return removed


@dataclass(frozen=True)
class RetentionPlan:
    """What a worker's periodic sweep applies, and to which stores."""

    config: RetentionConfig
    workspaces: WorkspaceStore | None = None
    memory: PurgingMemory | None = None
    tenants: tuple[str, ...] = ()

    def sweep(self, redis: aioredis.Redis, *, dry_run: bool = False) -> RetentionSweep:
        """A sweep of these rules over ``redis`` and the plan's stores."""
        return RetentionSweep(
            redis, self.config, workspaces=self.workspaces, memory=self.memory, tenants=self.tenants, dry_run=dry_run
        )


async def sweep_if_due(redis: aioredis.Redis, plan: RetentionPlan, worker_id: str) -> RetentionReport | None:
    """Run the sweep unless another worker ran it within the interval (a lock that lives one interval)."""
    if not await redis.set(_KEYS.retention_lock, worker_id, nx=True, px=max(int(plan.config.every * 1000), 1000)):
        return None
    return await plan.sweep(redis).run()
