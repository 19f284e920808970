"""③ Ingest: accept one inbound message durably, in one Lua script (one round trip on the hot path).

The script (``lua/ingest.lua``) does, atomically: dedup key ``SET NX EX`` → message record → inbox
append → runnable mark → session meta → ``message_received`` and ``run_queued`` facts → optional web
chat echo → and, only when no drain is pending for the session, the drain flag plus an RQ job pushed on
the queue. A platform retry can therefore never be dropped while its original was lost, and sessions
that already have a pending drain cost no RQ work at all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from switchboard.core.events import MessageReceived, RunQueued
from switchboard.core.messages import InboundMessage
from switchboard.errors import QueueUnavailableError
from switchboard.queue import scripts
from switchboard.queue.cancellation import is_stop, request_stop
from switchboard.queue.eventlog import encode_event
from switchboard.queue.jobs import DrainJobs, new_job_id, rq_time
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.scripts import ScriptArg
from switchboard.settings import QueueSettings
from switchboard.types import BusyPolicy

__all__ = ["WEB_ECHO_MAXLEN", "IngestResult", "Ingestor", "new_message_id"]

logger = logging.getLogger(__name__)

WEB_ECHO_MAXLEN = 1000
"""Approximate cap of each session's web stream (the web chat's retained history)."""
_QUEUED_STATUS = '{"status":"queued"}'
_GLOBAL = GlobalKeys()


class _Coalescer:
    """Sends the ingest scripts of concurrent requests in one pipeline per event-loop iteration.

    Each script stays its own atomic step; only the round trip is shared. Under load this divides the
    client library's per-round-trip cost (most of the gateway's CPU per request) by the batch size,
    and costs an idle gateway at most one loop iteration of latency.
    """

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._pending: list[tuple[list[str], list[ScriptArg], asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, keys: list[str], args: list[ScriptArg]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((keys, args, future))
        return future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[list[str], list[ScriptArg], asyncio.Future[Any]]]) -> None:
        live = [item for item in batch if not item[2].done()]
        if not live:
            return
        try:
            if len(live) == 1:
                results: list[Any] = [await scripts.INGEST(self.redis, live[0][0], live[0][1])]
            else:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for keys, args, _future in live:
                        pipe.evalsha(scripts.INGEST.sha, len(keys), *keys, *args)
                    results = await pipe.execute(raise_on_error=False)
                for i, result in enumerate(results):
                    if isinstance(result, NoScriptError):  # script cache flushed: load it and run this one alone
                        results[i] = await scripts.INGEST(self.redis, live[i][0], live[i][1])
        except BaseException as err:
            for _keys, _args, future in live:
                if not future.done():
                    future.set_exception(err if isinstance(err, Exception) else RedisError("ingest interrupted"))
            if not isinstance(err, Exception):
                raise
            return
        for (_keys, _args, future), result in zip(live, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


def new_message_id(now: float | None = None) -> str:
    """A gateway message id: 12 hex digits of milliseconds then 16 random hex digits (sortable by time)."""
    ms = int((time.time() if now is None else now) * 1000)
    return f"{ms:012x}{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What ingest did with one message."""

    message_id: str
    """The gateway id; for a duplicate, the id the original got."""
    duplicate: bool
    drain_enqueued: bool
    """Whether this call enqueued a drain job (no drain was pending for the session)."""


class Ingestor:
    """Accepts inbound messages into their sessions' queues."""

    def __init__(self, redis: aioredis.Redis, settings: QueueSettings) -> None:
        self.redis = redis
        self.settings = settings
        self._jobs = DrainJobs(settings.name)
        self._coalescer = _Coalescer(redis)
        self._config = json.dumps(
            {
                "dedup_ttl": settings.dedup_ttl_s,
                "events_maxlen": settings.events_maxlen,
                "web_maxlen": WEB_ECHO_MAXLEN,
                "queued_status": _QUEUED_STATUS,
                "job": json.loads(self._jobs.config),
            }
        )

    async def ingest(
        self,
        message: InboundMessage,
        *,
        busy_policy: BusyPolicy = "sequential",
        echo: Mapping[str, str] | None = None,
    ) -> IngestResult:
        """Durably accept ``message`` (dedup, append, mark runnable, enqueue a drain when none is pending).

        Args:
            message: the parsed draft; its ``id`` is assigned here.
            busy_policy: ``collect`` folds everything waiting into the session's next run.
            echo: web chat only: ``{"type": "user", "data": <json>}`` appended to the session's web stream
                in the same script, followed by a ``queued`` status entry.

        Raises:
            QueueUnavailableError: Redis did not confirm within ``ingest_timeout_s`` (answer 503: the
                platform retries, and the dedup key makes the retry safe).
        """
        try:
            return await self._ingest(message, busy_policy, echo)
        except (TimeoutError, RedisError, OSError) as err:
            logger.warning("ingest for %s not confirmed: %s", message.conversation.channel, type(err).__name__)
            raise QueueUnavailableError(f"Redis did not confirm the message: {type(err).__name__}") from err

    async def _ingest(
        self, message: InboundMessage, busy_policy: BusyPolicy, echo: Mapping[str, str] | None
    ) -> IngestResult:
        now = time.time()
        message_id = new_message_id(now)
        session = message.session_key
        keys = SessionKeys(session)
        accepted = message.model_copy(update={"id": message_id, "received_at": now})
        received = MessageReceived(
            at=now,
            message_id=message_id,
            channel=message.conversation.channel,
            sender=message.sender.id,
            chars=len(message.text),
        )
        job_id = new_job_id(now)
        echo_type = echo_data = ""
        if echo is not None:
            echo_type, echo_data = echo.get("type", "user"), echo.get("data", "{}")
        rq = self._jobs.keys
        async with asyncio.timeout(self.settings.ingest_timeout_s):
            duplicate, stored_id, drain = await self._coalescer.submit(
                [
                    keys.dedup(message.dedup_key),
                    keys.messages,
                    keys.inbox,
                    keys.meta,
                    keys.events,
                    keys.drain,
                    _GLOBAL.runnable,
                    _GLOBAL.sessions,
                    _GLOBAL.stats,
                    keys.web,
                    rq.job(job_id),
                    rq.queue,
                    rq.queues,
                ],
                [
                    message_id,
                    accepted.model_dump_json(),
                    int(now * 1000),
                    session,
                    message.conversation.channel,
                    busy_policy,
                    encode_event(received),
                    encode_event(RunQueued(at=now, message_id=message_id)),
                    echo_type,
                    echo_data,
                    job_id,
                    rq_time(now),
                    self._config,
                ],
            )
        stored = stored_id.decode() if isinstance(stored_id, bytes) else str(stored_id)
        if not duplicate and is_stop(message):
            # the /stop message waits its turn to be answered; the turn running now stops at once
            await request_stop(self.redis, session, reason=f"/stop from {message.sender.id}")
        return IngestResult(message_id=stored, duplicate=bool(duplicate), drain_enqueued=bool(drain))
