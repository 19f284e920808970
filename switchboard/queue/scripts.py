"""The session queue's Lua scripts: loaded once from ``lua/``, run by SHA, fenced ones share one prelude.

Every write made for a session while a drain runs goes through a script whose first step compares the
lease value with the caller's token (``_fence.lua``); a refused write increments the field ``fenced_rejections`` of
its shard's stats hash (:attr:`~switchboard.queue.keys.ShardKeys.fenced_rejections`) inside Redis and comes back as
:class:`~switchboard.errors.FencedWriteError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any, Final

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

from switchboard.errors import FencedWriteError
from switchboard.queue.connection import AsyncClient, node_connection, refresh_slots, send_on, stale_slots
from switchboard.types import SessionKey

__all__ = [
    "ACCESS_CHECK",
    "ACK_PRELUDE",
    "ALL",
    "APPROVAL_DECIDE",
    "APPROVAL_OPEN",
    "APPROVAL_PRELUDE",
    "APPROVAL_SETTLE",
    "APPROVAL_SUPERSEDE",
    "BEGIN",
    "BUCKET_HOLD",
    "BUCKET_TAKE",
    "BUDGET_CHARGE",
    "BUDGET_READ",
    "COMPLETE",
    "CONSOLE_THROTTLE",
    "CONTEXT_KEEP",
    "CONTEXT_TAKE",
    "CONTROL_SET",
    "DEAD_LETTER",
    "DEFER",
    "EFFECT_BEGIN",
    "EFFECT_DOUBT",
    "EFFECT_FINISH",
    "EFFECT_RESOLVE",
    "ENQUEUE",
    "FACTS",
    "FAIL",
    "FENCED_XADD",
    "HISTORY_APPEND",
    "INGEST",
    "INTERRUPT",
    "JOB_PRELUDE",
    "LEASE_ABANDON",
    "LEASE_ACQUIRE",
    "LEASE_RENEW",
    "LEASE_TAKEOVER",
    "LEASE_YIELD",
    "OFFER_RECORD",
    "OUTBOX_APPEND",
    "OUTBOX_CLAIM",
    "OUTBOX_PART",
    "OUTBOX_RECORD",
    "PEOPLE_LINK",
    "PEOPLE_UNLINK",
    "SCHEDULE_CLAIM",
    "SCHEDULE_DONE",
    "SCHEDULE_DUE",
    "SCHEDULE_PUT",
    "SCHEDULE_RECLAIM",
    "SCHEDULE_REMOVE",
    "SENDER_METER",
    "SESSION_QUOTA",
    "SESSION_RESET",
    "SLOT_SAVE",
    "STEER",
    "TAKE",
    "Script",
    "ScriptArg",
    "load_all",
]

ScriptArg = str | bytes | int | float


def _source(name: str) -> str:
    return resources.files("switchboard.queue").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


FENCE_PRELUDE: Final = _source("_fence")
ACK_PRELUDE: Final = _source("_ack")
JOB_PRELUDE: Final = _source("_job")
FACTS_PRELUDE: Final = _source("_facts")
LIMITS_PRELUDE: Final = _source("_limits")
RETENTION_PRELUDE: Final = _source("_retention")
APPROVAL_PRELUDE: Final = _source("_approval")
RELEASE_PRELUDE: Final = _source("_release")
BEGIN_PRELUDE: Final = _source("_begin")
LEASE_PRELUDE: Final = _source("_lease")


class Script:
    """One Lua script, run with ``EVALSHA`` (loaded on first ``NOSCRIPT``) on any client."""

    def __init__(self, name: str, *, fenced: bool = False, preludes: Sequence[str] = ()) -> None:
        self.name = name
        self.fenced = fenced
        parts = ([FENCE_PRELUDE] if fenced else []) + list(preludes) + [_source(name)]
        self.source = "\n".join(parts)
        self.sha = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()

    async def __call__(
        self,
        redis: AsyncClient,
        keys: Sequence[str],
        args: Sequence[ScriptArg],
        *,
        session: SessionKey | None = None,
        epoch: int = 0,
    ) -> Any:
        """Run the script; a fencing refusal becomes :class:`FencedWriteError` for ``session``."""
        try:
            try:
                return await redis.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:
                await redis.script_load(self.source)
                return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except ResponseError as err:
            raise self._refusal(err, session, epoch) from None

    def _refusal(self, err: ResponseError, session: SessionKey | None, epoch: int) -> Exception:
        """The error to raise for a refused call: :class:`FencedWriteError` for a fencing refusal, else ``err``."""
        if str(err).startswith("FENCED"):
            return FencedWriteError(
                f"{self.name}: the session lease has passed to another epoch",
                session_key=str(session or ""),
                epoch=epoch,
            )
        return err

    async def replicated(
        self,
        redis: AsyncClient,
        keys: Sequence[str],
        args: Sequence[ScriptArg],
        *,
        replicas: int,
        timeout_ms: int,
        rounds: int = 1,
        session: SessionKey | None = None,
        epoch: int = 0,
    ) -> tuple[Any, int]:
        """Run the script, then ``WAIT replicas timeout_ms`` on the same connection, up to ``rounds`` times.

        Returns the script's reply and how many replicas have its write (``WAIT`` counts those holding this
        connection's last write, hence one connection for both). On a Redis Cluster that connection is one of the
        node owning ``keys[0]``'s slot (:meth:`_replicated_on_node`).
        """
        if isinstance(redis, aioredis.RedisCluster):
            return await self._replicated_on_node(
                redis, keys, args, replicas=replicas, timeout_ms=timeout_ms, rounds=rounds, session=session, epoch=epoch
            )
        async with redis.client() as conn:
            reply = await self(conn, keys, args, session=session, epoch=epoch)
            acked = 0
            for _ in range(rounds):
                acked = int(await conn.execute_command("WAIT", replicas, timeout_ms))  # type: ignore[no-untyped-call]
                if acked >= replicas:
                    break
        return reply, acked

    async def _replicated_on_node(
        self,
        cluster: aioredis.RedisCluster,
        keys: Sequence[str],
        args: Sequence[ScriptArg],
        *,
        replicas: int,
        timeout_ms: int,
        rounds: int,
        session: SessionKey | None,
        epoch: int,
    ) -> tuple[Any, int]:
        """:meth:`replicated` on a cluster: the call and ``WAIT`` in one write to the node owning ``keys[0]``'s slot.

        Refused ``NOSCRIPT``, the three of ``SCRIPT LOAD``, the call and ``WAIT`` follow on the same connection. A
        call refused as not that node's slot's (``MOVED``/``ASK``/``TRYAGAIN``), or a node that cannot be reached,
        refreshes the cluster client's slot map and raises: the caller's step is retried.
        """
        node = cluster.get_node_from_key(keys[0])
        assert node is not None
        call, wait = ("EVALSHA", self.sha, len(keys), *keys, *args), ("WAIT", replicas, timeout_ms)
        try:
            async with node_connection(node) as conn:
                reply, acked = await send_on(conn, [call, wait])
                if isinstance(reply, NoScriptError):
                    _, reply, acked = await send_on(conn, [("SCRIPT", "LOAD", self.source), call, wait])
                if isinstance(reply, ResponseError):
                    raise self._refusal(reply, session, epoch)
                if isinstance(acked, Exception):
                    raise acked
                for _ in range(rounds - 1):
                    if int(acked) >= replicas:
                        break
                    (acked,) = await send_on(conn, [wait])
                    if isinstance(acked, Exception):
                        raise acked
        except Exception as err:
            if stale_slots(err):
                await refresh_slots(cluster, keys[0])
            raise
        return reply, int(acked)

    async def many(self, redis: AsyncClient, calls: Sequence[tuple[Sequence[str], Sequence[ScriptArg]]]) -> list[Any]:
        """Run the script once per ``(keys, args)`` in one pipeline (one round trip); results in order.

        For unfenced scripts whose calls are independent (the reaper's repairs). A server that lost its script
        cache refuses them all (``NOSCRIPT``), so they are re-sent once after loading it.
        """
        if not calls:
            return []
        for attempt in range(2):
            async with redis.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.evalsha(self.sha, len(keys), *keys, *args)
                try:
                    return list(await pipe.execute())
                except NoScriptError:
                    if attempt:
                        raise
                    await redis.script_load(self.source)
        raise AssertionError("unreachable")  # pragma: no cover


INGEST: Final = Script("ingest", preludes=[JOB_PRELUDE, LIMITS_PRELUDE, RETENTION_PRELUDE])
SESSION_QUOTA: Final = Script("session_quota", preludes=[LIMITS_PRELUDE])
SENDER_METER: Final = Script("sender_meter", preludes=[LIMITS_PRELUDE])
ENQUEUE: Final = Script("enqueue", preludes=[JOB_PRELUDE])
TAKE: Final = Script("take")
LEASE_ACQUIRE: Final = Script("lease_acquire", preludes=[LEASE_PRELUDE])
LEASE_RENEW: Final = Script("lease_renew")
LEASE_ABANDON: Final = Script("lease_abandon")
LEASE_YIELD: Final = Script("lease_yield", fenced=True, preludes=[JOB_PRELUDE, RELEASE_PRELUDE])
LEASE_TAKEOVER: Final = Script("lease_takeover", preludes=[JOB_PRELUDE])
FENCED_XADD: Final = Script("fenced_xadd", fenced=True, preludes=[RETENTION_PRELUDE])
BEGIN: Final = Script("begin", fenced=True, preludes=[RETENTION_PRELUDE, RELEASE_PRELUDE, BEGIN_PRELUDE, LEASE_PRELUDE])
FAIL: Final = Script("fail", fenced=True)
COMPLETE: Final = Script(
    "complete", fenced=True, preludes=[ACK_PRELUDE, RETENTION_PRELUDE, RELEASE_PRELUDE, JOB_PRELUDE, BEGIN_PRELUDE]
)
DEAD_LETTER: Final = Script("dead_letter", fenced=True, preludes=[ACK_PRELUDE, RETENTION_PRELUDE])
DEFER: Final = Script("defer", fenced=True)
STEER: Final = Script("steer", fenced=True)
INTERRUPT: Final = Script("interrupt", fenced=True)
OUTBOX_CLAIM: Final = Script("outbox_claim", fenced=True, preludes=[FACTS_PRELUDE])
FACTS: Final = Script("facts", fenced=True, preludes=[FACTS_PRELUDE])
OUTBOX_RECORD: Final = Script("outbox_record", fenced=True)
OUTBOX_PART: Final = Script("outbox_part", fenced=True)
BUCKET_TAKE: Final = Script("bucket_take", preludes=[LIMITS_PRELUDE])
BUCKET_HOLD: Final = Script("bucket_hold", preludes=[LIMITS_PRELUDE])
OUTBOX_APPEND: Final = Script("outbox_append", fenced=True, preludes=[RETENTION_PRELUDE])
HISTORY_APPEND: Final = Script("history_append", fenced=True)
SLOT_SAVE: Final = Script("slot_save", fenced=True, preludes=[RETENTION_PRELUDE])
SESSION_RESET: Final = Script("session_reset", fenced=True)
EFFECT_BEGIN: Final = Script("effect_begin", fenced=True)
EFFECT_FINISH: Final = Script("effect_finish", fenced=True)
OFFER_RECORD: Final = Script("offer_record", fenced=True)
EFFECT_DOUBT: Final = Script("effect_doubt", fenced=True)
EFFECT_RESOLVE: Final = Script("effect_resolve")
APPROVAL_OPEN: Final = Script("approval_open", fenced=True)
APPROVAL_DECIDE: Final = Script("approval_decide", fenced=True, preludes=[APPROVAL_PRELUDE])
APPROVAL_SUPERSEDE: Final = Script("approval_supersede", fenced=True, preludes=[APPROVAL_PRELUDE])
APPROVAL_SETTLE: Final = Script("approval_settle", fenced=True)
CONTROL_SET: Final = Script("control_set", fenced=True)
CONSOLE_THROTTLE: Final = Script("console_throttle")
CONTEXT_KEEP: Final = Script("context_keep")
CONTEXT_TAKE: Final = Script("context_take", fenced=True)
ACCESS_CHECK: Final = Script("access_check")
BUDGET_READ: Final = Script("budget_read")
BUDGET_CHARGE: Final = Script("budget_charge")
PEOPLE_LINK: Final = Script("people_link")
PEOPLE_UNLINK: Final = Script("people_unlink")
SCHEDULE_PUT: Final = Script("schedule_put")
SCHEDULE_REMOVE: Final = Script("schedule_remove")
SCHEDULE_DUE: Final = Script("schedule_due")
SCHEDULE_CLAIM: Final = Script("schedule_claim")
SCHEDULE_RECLAIM: Final = Script("schedule_reclaim")
SCHEDULE_DONE: Final = Script("schedule_done")

ALL: Final = (
    INGEST,
    CONTEXT_KEEP,
    CONTEXT_TAKE,
    ACCESS_CHECK,
    SESSION_QUOTA,
    SENDER_METER,
    ENQUEUE,
    TAKE,
    LEASE_ACQUIRE,
    LEASE_RENEW,
    LEASE_ABANDON,
    LEASE_YIELD,
    LEASE_TAKEOVER,
    FENCED_XADD,
    BEGIN,
    FAIL,
    COMPLETE,
    DEAD_LETTER,
    DEFER,
    STEER,
    INTERRUPT,
    OUTBOX_CLAIM,
    FACTS,
    OUTBOX_RECORD,
    OUTBOX_PART,
    BUCKET_TAKE,
    BUCKET_HOLD,
    OUTBOX_APPEND,
    HISTORY_APPEND,
    SLOT_SAVE,
    SESSION_RESET,
    EFFECT_BEGIN,
    EFFECT_FINISH,
    OFFER_RECORD,
    EFFECT_DOUBT,
    EFFECT_RESOLVE,
    APPROVAL_OPEN,
    APPROVAL_DECIDE,
    APPROVAL_SUPERSEDE,
    APPROVAL_SETTLE,
    CONTROL_SET,
    CONSOLE_THROTTLE,
    BUDGET_READ,
    BUDGET_CHARGE,
    PEOPLE_LINK,
    PEOPLE_UNLINK,
    SCHEDULE_PUT,
    SCHEDULE_REMOVE,
    SCHEDULE_DUE,
    SCHEDULE_CLAIM,
    SCHEDULE_RECLAIM,
    SCHEDULE_DONE,
)
"""Every script, for :func:`load_all`."""


async def load_all(redis: AsyncClient) -> None:
    """Load every script into the server's script cache (one pipeline), so the hot path never sees NOSCRIPT.

    On a cluster, into every primary's (redis-py sends ``SCRIPT LOAD`` to each, and refuses it in a pipeline).
    """
    if isinstance(redis, aioredis.RedisCluster):
        for script in ALL:  # one at a time: a connection per node, at start-up only
            await redis.script_load(script.source)
        return
    async with redis.pipeline(transaction=False) as pipe:
        for script in ALL:
            pipe.script_load(script.source)
        await pipe.execute()
