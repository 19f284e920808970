"""Erasure: remove a person's, a session's or a whole tenant's data from every store that holds it today.

The stores are the Redis keys of :mod:`switchboard.queue.keys` (each session's own keys, and the global and per-tenant
indexes that hold session keys or principals as members) and the workspace store. A person is every principal linked
to them (:mod:`switchboard.queue.people`); their sessions are those whose every sender is one of those principals (a
group session shared with someone else is kept, and counted as such). What was removed is counted per store, never
shown; one audit fact records who erased what scope, with the subject only as a digest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from switchboard.core.workspaces.disk import tenant_dir
from switchboard.core.workspaces.store import LocalWorkspaces
from switchboard.queue.fanout import zscan_every
from switchboard.queue.jobs import entry as drain_entry
from switchboard.queue.keys import GlobalKeys, SessionKeys, ShardKeys, literal, session_in, tenant_of
from switchboard.queue.people import check_person, check_principal
from switchboard.queue.schedules import get_job, remove_job
from switchboard.types import SessionKey

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.core.workspaces.store import WorkspaceStore

__all__ = ["AUDIT_CAP", "ErasableMemory", "Eraser", "ErasureReport", "ScopeKind"]

logger = logging.getLogger(__name__)

_KEYS = GlobalKeys()


def _sessions(shard: ShardKeys) -> str:
    return shard.sessions


def _runnable(shard: ShardKeys) -> str:
    return shard.runnable


def _deferred(shard: ShardKeys) -> str:
    return shard.deferred


AUDIT_CAP = 10_000
"""Erasure facts kept in the audit stream."""

ScopeKind = Literal["tenant", "user", "session"]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class ErasureReport:
    """What an erasure removed (or, dry, would remove): counts per store, never content."""

    tenant: str
    scope: ScopeKind
    dry_run: bool
    sessions: int = 0
    """Sessions erased whole."""
    shared_kept: int = 0
    """Sessions the person shares with other senders (groups): kept (see ``docs/operations/retention.md``)."""
    counts: Counter[str] = field(default_factory=Counter)
    """Store → entries removed (keys, members, fields, stream entries, workspaces, memory facts)."""
    not_counted: set[str] = field(default_factory=set)
    """Stores a dry run cannot count (the memory store removes without listing first)."""

    def lines(self) -> list[str]:
        """The report as the CLI prints it."""
        verb = "would remove" if self.dry_run else "removed"
        out = [f"{verb} ({self.scope} of tenant {self.tenant}): {self.sessions} session(s)"]
        out += [f"  {store}: {count}" for store, count in sorted(self.counts.items()) if count]
        out += [f"  {store}: not counted in a dry run" for store in sorted(self.not_counted)]
        if self.shared_kept:
            out.append(f"  kept: {self.shared_kept} session(s) shared with other senders")
        return out


class ErasableMemory(Protocol):
    """What erasure needs of a memory store (part of :class:`~switchboard.core.memory.store.MemoryStore`)."""

    async def erase(self, tenant: str, *, actor: str | None = None) -> int:
        """All of ``tenant``'s memory (``actor`` ``None``), or the facts remembered for ``actor``; facts removed."""
        ...


class Eraser:
    """Finds and removes one scope's data; with ``dry_run`` it only counts."""

    def __init__(
        self,
        redis: aioredis.Redis,
        workspaces: WorkspaceStore | None = None,
        *,
        memory: ErasableMemory | None = None,
        dry_run: bool = False,
    ):
        self.redis = redis
        self.workspaces = workspaces
        self.memory = memory
        """The memory store (facts, documents, knowledge, their indexes and cached embeddings), if one is configured."""
        self.dry_run = dry_run

    # -- what to erase -----------------------------------------------------------------------------------------

    async def _entries(self, stream: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        entries: Any = await self.redis.xrange(stream)
        return list(entries or [])

    async def _scan(self, pattern: str) -> list[str]:
        return sorted({_text(k) async for k in self.redis.scan_iter(match=pattern, count=1000)})

    async def tenant_sessions(self, tenant: str) -> set[SessionKey]:
        """Every session of ``tenant`` any store knows of: its own keys, the global indexes, its schedules."""
        found: set[str] = set()
        for key in await self._scan(_KEYS.tenant_sessions(tenant)):
            session = session_in(key)
            if session is not None:
                found.add(session)
        for index in (_sessions, _runnable, _deferred):  # a session with no key left may still be in an index
            found.update(member for _shard, member in await zscan_every(self.redis, index, f"{literal(tenant)}/*"))
        for job_id in await self.redis.smembers(_KEYS.schedules_of_tenant(tenant)):
            view = await get_job(self.redis, _text(job_id))
            if view is not None:
                found.add(view.session)
        return {SessionKey(s) for s in found if tenant_of(SessionKey(s)) == tenant}

    async def principals_of(self, tenant: str, user: str) -> tuple[set[str], str | None]:
        """The principals of ``user`` (a principal or a person id) and their person, if linked."""
        linked: dict[Any, Any] = await self.redis.hgetall(_KEYS.people(tenant))
        people = {_text(k): _text(v) for k, v in linked.items()}
        person = people.get(user) if ":" in user else user
        principals = {p for p, who in people.items() if person is not None and who == person}
        if ":" in user:
            principals.add(user)
        return principals, person if person is not None and principals else None

    async def senders(self, session: SessionKey) -> set[str]:
        """The principals (``channel:sender``) that wrote to ``session``, from its event log."""
        out: set[str] = set()
        for _, entry in await self._entries(SessionKeys(session).events):
            if _text(entry.get(b"kind", b"")) == "message_received":
                data = json.loads(entry[b"data"])
                out.add(f"{data['channel']}:{data['sender']}")
        return out

    # -- removal primitives (counting; acting only when not dry) ---------------------------------------------

    async def _delete(self, store: str, keys: Iterable[str], report: ErasureReport) -> None:
        present = [k for k in keys if await self.redis.exists(k)]
        report.counts[store] += len(present)
        if present and not self.dry_run:
            await self.redis.delete(*present)

    async def _zrem(self, store: str, key: str, members: Iterable[str], report: ErasureReport) -> None:
        present = [m for m in members if await self.redis.zscore(key, m) is not None]
        report.counts[store] += len(present)
        if present and not self.dry_run:
            await self.redis.zrem(key, *present)

    async def _zrem_matching(self, store: str, key: str, pattern: str, report: ErasureReport) -> None:
        members = [_text(m) async for m, _ in self.redis.zscan_iter(key, match=pattern)]
        await self._zrem(store, key, members, report)

    async def _hdel(self, store: str, key: str, fields: Iterable[str], report: ErasureReport) -> None:
        present = [f for f in fields if await self.redis.hexists(key, f)]
        report.counts[store] += len(present)
        if present and not self.dry_run:
            await self.redis.hdel(key, *present)

    async def _hdel_matching(self, store: str, key: str, pattern: str, report: ErasureReport) -> None:
        fields = [_text(f) async for f, _ in self.redis.hscan_iter(key, match=pattern)]
        await self._hdel(store, key, fields, report)

    async def _xdel_where(self, store: str, key: str, keep: Any, report: ErasureReport) -> None:
        """Delete the entries of stream ``key`` for which ``keep(fields)`` is false."""
        doomed = [eid for eid, entry in await self._entries(key) if not keep(entry)]
        report.counts[store] += len(doomed)
        if doomed and not self.dry_run:
            await self.redis.xdel(key, *doomed)

    # -- scopes ----------------------------------------------------------------------------------------------

    async def _erase_sessions(self, tenant: str, sessions: set[SessionKey], report: ErasureReport) -> None:
        report.sessions += len(sessions)
        for session in sorted(sessions):
            await self._delete("session keys", await self._scan(SessionKeys(session).every), report)
            shard = SessionKeys(session).shard
            for index in (shard.sessions, shard.runnable, shard.deferred):
                await self._zrem("session indexes", index, [session], report)
            for index in (shard.approvals_due, shard.approvals_pending(tenant)):
                await self._zrem_matching("approval indexes", index, f"{literal(session)}|*", report)
            await self._hdel_matching(
                "effects in doubt", shard.effects_in_doubt(tenant), f"{literal(session)}|*", report
            )
            await self._hdel("webhook cursors", _KEYS.webhook_cursors(tenant), [session], report)
            await self._hdel_matching("review", _KEYS.review_verdicts(tenant), f"{literal(session)}|*", report)
            await self._delete("web chat streams", [_KEYS.web_streams_by_session(session)], report)
            agent_less = session.split("/", 2)
            if len(agent_less) == 3:
                await self._delete("handoffs", [_KEYS.handoff(f"{agent_less[0]}/-/{agent_less[2]}")], report)
            jobs = [_text(j) for j in await self.redis.smembers(_KEYS.schedules_of_session(session))]
            report.counts["schedules"] += len(jobs)
            if not self.dry_run:
                for job_id in jobs:
                    await remove_job(self.redis, job_id)
                await self.redis.delete(_KEYS.schedules_of_session(session))
            await self._erase_workspace(session, report)
        if sessions:
            for family in (_KEYS.web_token("*"), _KEYS.every_web_ticket):
                tokens = [k for k in await self._scan(family) if _text(await self.redis.get(k) or b"") in sessions]
                await self._delete("web chat tokens", tokens, report)

            def keep(entry: dict[bytes, bytes]) -> bool:
                try:
                    return json.loads(entry.get(b"record", b"{}")).get("session") not in sessions
                except ValueError:
                    return True

            for shard in sorted({SessionKeys(s).shard for s in sessions}, key=lambda k: k.shard):
                await self._xdel_where("dead letters", shard.dead_letters, keep, report)
            await self._erase_samples(tenant, sessions, report)
            await self._erase_drain_jobs(sessions, report)
            await self._erase_webhook_deliveries(tenant, sessions, report)

    async def _erase_samples(self, tenant: str, sessions: set[SessionKey], report: ErasureReport) -> None:
        """The sessions' runs sampled for review (their verdicts go with each session)."""
        key = _KEYS.review_runs(tenant)
        doomed: list[str] = []
        for raw in await self.redis.lrange(key, 0, -1):
            try:
                sampled = json.loads(raw).get("session")
            except (ValueError, AttributeError):
                continue
            if sampled in sessions:
                doomed.append(_text(raw))
        report.counts["review"] += len(doomed)
        if not self.dry_run:
            for raw in doomed:
                await self.redis.lrem(key, 0, raw)

    async def _erase_webhook_deliveries(self, tenant: str, sessions: set[SessionKey], report: ErasureReport) -> None:
        """Outbound webhook deliveries of ``sessions``: waiting (with their due entries) and given up."""
        waiting: list[str] = []
        async for delivery_id, raw in self.redis.hscan_iter(_KEYS.webhook_deliveries(tenant)):
            try:
                session = json.loads(raw).get("body", {}).get("session")
            except (ValueError, AttributeError):
                continue
            if session in sessions:
                waiting.append(_text(delivery_id))
        await self._hdel("webhook deliveries", _KEYS.webhook_deliveries(tenant), waiting, report)
        if waiting and not self.dry_run:
            await self.redis.zrem(_KEYS.webhook_due(tenant), *waiting)

        def keep(entry: dict[bytes, bytes]) -> bool:
            try:
                return json.loads(entry.get(b"body", b"{}")).get("session") not in sessions
            except (ValueError, AttributeError):
                return True

        await self._xdel_where("webhook deliveries", _KEYS.webhook_dead(tenant), keep, report)

    async def _erase_memory(self, tenant: str, actors: set[str] | None, report: ErasureReport) -> None:
        """The memory store's facts of ``actors`` (every principal of the person), or (``None``) the tenant's all."""
        if self.memory is None:
            return
        if self.dry_run:
            report.not_counted.add("memory")
            return
        if actors is None:
            report.counts["memory facts"] += await self.memory.erase(tenant)
            return
        for actor in sorted(actors):
            report.counts["memory facts"] += await self.memory.erase(tenant, actor=actor)

    async def _erase_workspace(self, session: SessionKey, report: ErasureReport) -> None:
        """The session's workspace: a local one is counted if it exists; a remote store is always asked to delete.

        A remote store (S3) holds it whether or not this host has a working copy, so its deletion never depends on one.
        """
        if self.workspaces is None:
            return
        if isinstance(self.workspaces, LocalWorkspaces):
            if not self.workspaces.path(session).exists():
                return
            report.counts["workspaces"] += 1
        else:
            report.counts["workspaces (remote store, asked)"] += 1
        if not self.dry_run:
            await self.workspaces.delete(session)

    async def _erase_drain_jobs(self, sessions: set[SessionKey], report: ErasureReport) -> None:
        """The drain entries of ``sessions`` (``<session>|<job id>``) in their shards' drain queues and running sets."""
        for session in sorted(sessions):
            shard = SessionKeys(session).shard
            head = drain_entry(session, "")
            queued = {_text(e) for e in await self.redis.lrange(shard.drainq, 0, -1)}
            running = [_text(m) async for m, _ in self.redis.zscan_iter(shard.wip, match=f"{literal(head)}*")]
            mine = sorted(e for e in queued if e.startswith(head)) + running
            report.counts["drain jobs"] += len(mine)
            if self.dry_run or not mine:
                continue
            for queued_entry in (e for e in mine if e in queued):
                await self.redis.lrem(shard.drainq, 0, queued_entry)
            if running:
                await self.redis.zrem(shard.wip, *running)

    async def _erase_person(self, tenant: str, principals: set[str], person: str | None, report: ErasureReport) -> None:
        await self._hdel("people links", _KEYS.people(tenant), principals, report)
        names = principals | ({person} if person else set())

        def keep_link(entry: dict[bytes, bytes]) -> bool:
            data = json.loads(entry.get(b"data", b"{}"))
            mentioned = {data.get("person"), data.get("principal"), *data.get("principals", ())}
            return not (mentioned & names)

        await self._xdel_where("people log", _KEYS.people_log(tenant), keep_link, report)
        await self._hdel("access", _KEYS.access_paired(tenant), principals, report)
        await self._zrem("access", _KEYS.access_requests(tenant), principals, report)
        per_principal: list[str] = []
        for principal in principals:
            per_principal += [
                _KEYS.link_tries(tenant, principal),
                _KEYS.access_pending(tenant, principal),
                _KEYS.access_notice(tenant, principal),
            ]
            channel, _, sender = principal.partition(":")
            per_principal += await self._scan(_KEYS.sender_rates(tenant, channel, sender))
        await self._delete("access", per_principal, report)
        budget_keys = [key for name in names for key in await self._scan(_KEYS.user_budgets(tenant, name))]
        await self._delete("budgets", budget_keys, report)
        await self._zrem("budgets", _KEYS.budget_counters(tenant), budget_keys, report)
        await self._xdel_where(
            "budgets", _KEYS.budget_alerts(tenant), lambda e: _text(e.get(b"subject", b"")) not in names, report
        )

    async def _erase_tenant(self, tenant: str, report: ErasureReport) -> None:
        for pattern in _KEYS.tenant_families(tenant):
            await self._delete("tenant keys", await self._scan(pattern), report)
        per_shard = [k for s in ShardKeys.every() for k in (s.effects_in_doubt(tenant), s.approvals_pending(tenant))]
        async with self.redis.pipeline(transaction=False) as pipe:  # one round trip for the 2,048 names
            for key in per_shard:
                pipe.exists(key)
            present = await pipe.execute()
        await self._delete("tenant keys", [k for k, n in zip(per_shard, present, strict=True) if n], report)
        singles = [
            _KEYS.mcp_clients(tenant),
            _KEYS.agent_drafts(tenant),
        ]
        await self._delete("tenant keys", singles, report)
        mcp = []
        for key in await self._scan(_KEYS.mcp_client("*")):
            raw = await self.redis.get(key)
            if raw is not None and json.loads(raw).get("tenant") == tenant:
                mcp.append(key)
        await self._delete("tenant keys", mcp, report)
        jobs = [_text(j) for j in await self.redis.smembers(_KEYS.schedules_of_tenant(tenant))]
        report.counts["schedules"] += len(jobs)
        if not self.dry_run:
            for job_id in jobs:
                await remove_job(self.redis, job_id)
            await self.redis.delete(_KEYS.schedules_of_tenant(tenant))
        if self.workspaces is None:
            return
        if isinstance(self.workspaces, LocalWorkspaces):
            if tenant_dir(self.workspaces.root, f"{tenant}/-").exists():
                report.counts["workspaces"] += 1
                if not self.dry_run:
                    await self.workspaces.delete_tenant(tenant)
        elif self.dry_run:
            report.not_counted.add("workspace objects (remote store)")
        else:  # the whole prefix: objects of sessions Redis no longer names go too
            report.counts["workspace objects (remote store)"] += await self.workspaces.delete_tenant(tenant)

    async def erase(
        self, tenant: str, *, user: str | None = None, session: SessionKey | None = None, by: str
    ) -> ErasureReport:
        """Erase ``session``, or ``user``'s sessions and identity, or (neither given) the whole ``tenant``.

        Raises:
            ValueError: the session is not the tenant's, or the user is neither a principal nor a linked person.
            ConfigError: the user is not spelled as a principal (``channel:id``) or a person id.
        """
        subject: str
        scope: ScopeKind = "session" if session else "user" if user else "tenant"
        report = ErasureReport(tenant=tenant, scope=scope, dry_run=self.dry_run)
        if session is not None:
            if tenant_of(session) != tenant:
                raise ValueError(f"session {session!r} is not of tenant {tenant!r}")
            await self._erase_sessions(tenant, {session}, report)
            subject = session
        elif user is not None:
            if ":" in user:
                check_principal(user)
            else:
                check_person(user)
            principals, person = await self.principals_of(tenant, user)
            if not principals:
                raise ValueError(f"{user!r} is not a principal (channel:id) nor a linked person of tenant {tenant!r}")
            owned: set[SessionKey] = set()
            for candidate in await self.tenant_sessions(tenant):
                wrote = await self.senders(candidate)
                if wrote and wrote <= principals:
                    owned.add(candidate)
                elif wrote & principals:
                    report.shared_kept += 1
            await self._erase_sessions(tenant, owned, report)
            await self._erase_person(tenant, principals, person, report)
            await self._erase_memory(tenant, principals, report)
            subject = user
        else:
            await self._erase_sessions(tenant, await self.tenant_sessions(tenant), report)
            await self._erase_tenant(tenant, report)
            await self._erase_memory(tenant, None, report)
            subject = tenant
        if not self.dry_run:
            fact = {
                "at": repr(time.time()),
                "by": by,
                "tenant": tenant,
                "scope": scope,
                "subject_sha256": hashlib.sha256(subject.encode()).hexdigest(),
                "counts": json.dumps(dict(report.counts), sort_keys=True),
                "sessions": str(report.sessions),
            }
            await self.redis.xadd(_KEYS.erasures, fact, maxlen=AUDIT_CAP, approximate=True)  # type: ignore[arg-type]
        logger.info("erasure of a %s of tenant %s: %s", scope, tenant, dict(report.counts))
        return report
