"""Outbound webhooks: a tenant's events, read from its sessions' event logs, posted signed to the operator's URLs.

Where events come from: every ``poll_s`` the delivery loop (in the worker process, only when ``api.webhooks`` names
a URL) takes the tenant's lock, reads the event logs of the tenant's sessions that had a message in the last
``lookback_s`` from a cursor per session, and queues one delivery per subscribed URL and event. Nothing is added to
the message path: with no webhook configured the loop does not run at all.

How they leave: each delivery is a ``POST`` of ``{"id", "type", "created", "tenant", "session", "data"}`` with
``Switchboard-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`` (as Stripe's). A ``5xx``, ``408``,
``429``, a timeout or a connection failure is retried with exponential backoff and jitter up to ``max_attempts``;
then, or at once for any other answer or a refused address, the delivery is dead-lettered (a capped stream per
tenant, ``switchboard webhooks dead-letters``). Delivery is at least once: a receiver drops repeats by ``id``, which
is the same on every attempt. Egress is checked as the agents' is (:mod:`switchboard.egress.addresses`): private,
loopback and metadata addresses are refused unless the URL's ``allow_networks`` names them (metadata: never), and
redirects are not followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import redis.asyncio as aioredis
from redis import Redis as SyncRedis
from redis.exceptions import RedisError
from yarl import URL

from switchboard.core.messages import session_key
from switchboard.egress.addresses import AddressGuard, AddressRefusedError, GuardedResolver
from switchboard.errors import ConfigError
from switchboard.queue.eventlog import decode_entries
from switchboard.queue.fanout import each_shard
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.settings.api import WebhookEndpoint, WebhookSettings
from switchboard.types import SessionKey

__all__ = [
    "SIGNATURE_HEADER",
    "WebhookDispatcher",
    "dead_letters",
    "escaped_tenant",
    "event_id",
    "sign",
    "verify_signature",
]

logger = logging.getLogger(__name__)

SIGNATURE_HEADER: Final = "Switchboard-Signature"
EVENT_ID_HEADER: Final = "Switchboard-Event-Id"
DEAD_MAXLEN: Final = 10_000
SENT_KEEP_S: Final = 7 * 24 * 3600
_READ_BATCH: Final = 200
_GLOBAL: Final = GlobalKeys()
_RETRIED: Final = frozenset({408, 429})


def escaped_tenant(tenant: str) -> str:
    """A tenant name as its session keys (and the per-tenant keys) spell it."""
    return session_key(tenant, "a", "web", "a", "a").split("/", 1)[0]


def event_id(session: str, entry_id: str) -> str:
    """The event's id in every delivery of it: stable, unique per session and event-log entry."""
    return "evt_" + hashlib.sha256(f"{session}|{entry_id}".encode()).hexdigest()[:32]


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``Switchboard-Signature`` value for ``body`` sent at ``timestamp`` (unix seconds)."""
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify_signature(secret: bytes, header: str, body: bytes, *, tolerance_s: float = 300.0) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` and is at most ``tolerance_s`` old (what a receiver does)."""
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        fields.setdefault(name, []).append(value)
    try:
        timestamp = int(fields.get("t", [""])[0])
    except ValueError:
        return False
    if abs(time.time() - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).rsplit("=", 1)[1]
    return any(hmac.compare_digest(expected, given) for given in fields.get("v1", []))


def dead_letters(redis: SyncRedis, tenant: str, limit: int = 50) -> list[dict[str, str]]:
    """The tenant's dead-lettered deliveries, newest first (``switchboard webhooks dead-letters``)."""
    entries: Any = redis.xrevrange(_GLOBAL.webhook_dead(escaped_tenant(tenant)), count=max(1, limit))
    return [{_text(k): _text(v) for k, v in fields.items() if _text(k) != "body"} for _, fields in entries or []]


@dataclass(frozen=True, slots=True)
class _Target:
    index: int
    endpoint: WebhookEndpoint
    secret: bytes


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class WebhookDispatcher:
    """The delivery loop of every tenant with webhooks, in one process (a lock per tenant keeps it to one)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        endpoints: Sequence[WebhookEndpoint],
        settings: WebhookSettings,
        environ: Mapping[str, str],
        *,
        owner: str,
        resolver: Any = None,
    ) -> None:
        """Build the loop.

        Args:
            redis: the queue's Redis.
            endpoints: ``api.webhooks`` from the YAML file.
            settings: ``SWITCHBOARD_WEBHOOKS__*``.
            environ: where each ``secret_env`` is read.
            owner: this process's id (holds the tenants' locks).
            resolver: the DNS resolver under the address check (the system's; tests map names to loopback).

        Raises:
            ConfigError: a ``secret_env`` is not set.
        """
        self.redis = redis
        self.settings = settings
        self.owner = owner
        self._resolver = resolver
        self.targets: dict[str, list[_Target]] = {}
        for index, endpoint in enumerate(endpoints):
            secret = environ.get(endpoint.secret_env, "")
            if not secret:
                raise ConfigError(
                    f"api.webhooks[{index}].secret_env names {endpoint.secret_env}, which is not set",
                    field=f"api.webhooks.{index}.secret_env",
                )
            self.targets.setdefault(endpoint.tenant, []).append(_Target(index, endpoint, secret.encode()))
        self._sessions: dict[tuple[str, ...], aiohttp.ClientSession] = {}

    # -- the loop ------------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; a failing pass is logged and the next one tries again."""
        try:
            while not stop.is_set():
                try:
                    await self.run_once()
                except (RedisError, OSError, TimeoutError) as err:
                    logger.warning("webhook delivery pass failed: %s", type(err).__name__)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.settings.poll_s)
        finally:
            await self.close()

    async def run_once(self) -> None:
        """One pass over every tenant this process holds (or takes) the lock of."""
        for tenant, targets in self.targets.items():
            if await self._lock(tenant):
                await self.harvest(tenant, targets)
                await self.deliver_due(tenant, targets)

    async def close(self) -> None:
        """Close the HTTP connection pools."""
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    async def _lock(self, tenant: str) -> bool:
        key = _GLOBAL.webhook_lock(escaped_tenant(tenant))
        ttl_ms = round((self.settings.poll_s * 5 + self.settings.timeout_s * 2) * 1000)
        if await self.redis.set(key, self.owner, nx=True, px=ttl_ms):
            return True
        if _text(await self.redis.get(key) or b"") == self.owner:
            await self.redis.pexpire(key, ttl_ms)
            return True
        return False

    # -- reading events --------------------------------------------------------------------------------------------

    async def harvest(self, tenant: str, targets: Sequence[_Target]) -> int:
        """Queue a delivery per subscribed URL for each new event of the tenant's recently active sessions."""
        escaped = escaped_tenant(tenant)
        cursors_key = _GLOBAL.webhook_cursors(escaped)
        now = time.time()
        await self.redis.hsetnx(cursors_key, "~since", f"{int(now * 1000)}-0")
        since = _text(await self.redis.hget(cursors_key, "~since"))
        since_s = now - self.settings.lookback_s
        recent = await each_shard(self.redis, lambda pipe, shard: pipe.zrangebyscore(shard.sessions, since_s, "+inf"))
        sessions = [SessionKey(_text(m)) for members in recent for m in members if _text(m).startswith(escaped + "/")]
        if not sessions:
            return 0
        cursors = await self.redis.hmget(cursors_key, sessions)
        async with self.redis.pipeline(transaction=False) as pipe:
            for session, cursor in zip(sessions, cursors, strict=True):
                start = f"({_text(cursor)}" if cursor else since
                pipe.xrange(SessionKeys(session).events, min=start, count=_READ_BATCH)
            reads = await pipe.execute()
        queued = 0
        for session, entries in zip(sessions, reads, strict=True):
            if entries:
                queued += await self._queue(tenant, escaped, session, entries, targets)
        return queued

    async def _queue(
        self, tenant: str, escaped: str, session: SessionKey, entries: Any, targets: Sequence[_Target]
    ) -> int:
        deliveries: dict[str, str] = {}
        for event in decode_entries(entries):
            for target in targets:
                if event["kind"] not in target.endpoint.events:
                    continue
                eid = event_id(session, event["id"])
                data = {k: v for k, v in event.items() if k not in ("id", "ts", "kind")}
                body = {"id": eid, "type": event["kind"], "created": event["ts"], "tenant": tenant}
                body |= {"session": session, "data": data}
                record = {"endpoint": target.index, "body": body, "attempts": 0, "last_error": ""}
                deliveries[f"{target.index}:{eid}"] = json.dumps(record, separators=(",", ":"))
        ids = list(deliveries)
        sent = await self.redis.zmscore(_GLOBAL.webhook_sent(escaped), ids) if ids else []
        now = time.time()
        async with self.redis.pipeline(transaction=True) as pipe:
            for delivery_id, already in zip(ids, sent, strict=True):
                if already is None:  # delivered before (a cursor lost and read again): not twice
                    pipe.hsetnx(_GLOBAL.webhook_deliveries(escaped), delivery_id, deliveries[delivery_id])
                    pipe.zadd(_GLOBAL.webhook_due(escaped), {delivery_id: now}, nx=True)
            pipe.hset(_GLOBAL.webhook_cursors(escaped), session, _text(entries[-1][0]))
            await pipe.execute()
        return sum(1 for s in sent if s is None)

    # -- sending ---------------------------------------------------------------------------------------------------

    async def deliver_due(self, tenant: str, targets: Sequence[_Target]) -> int:
        """Attempt every delivery that is due (at once, each its own request); returns how many succeeded."""
        escaped = escaped_tenant(tenant)
        due = [_text(m) for m in await self.redis.zrangebyscore(_GLOBAL.webhook_due(escaped), "-inf", time.time())]
        if not due:
            return 0
        records = await self.redis.hmget(_GLOBAL.webhook_deliveries(escaped), due)
        by_index = {target.index: target for target in targets}
        work = []
        for delivery_id, raw in zip(due, records, strict=True):
            if raw is None:
                await self.redis.zrem(_GLOBAL.webhook_due(escaped), delivery_id)
                continue
            record = json.loads(raw)
            target = by_index.get(int(record["endpoint"]))
            if target is None:  # its URL was removed from the YAML file since
                await self._dead(escaped, delivery_id, record, "endpoint_removed", url="")
                continue
            work.append(self._attempt(escaped, delivery_id, record, target))
        results = await asyncio.gather(*work)
        return sum(results)

    async def _attempt(self, escaped: str, delivery_id: str, record: dict[str, Any], target: _Target) -> bool:
        body = json.dumps(record["body"], separators=(",", ":"), ensure_ascii=False).encode()
        retry, reason = await self._post(target, record["body"]["id"], record["body"]["type"], body)
        attempts = int(record["attempts"]) + 1
        if reason is None:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hdel(_GLOBAL.webhook_deliveries(escaped), delivery_id)
                pipe.zrem(_GLOBAL.webhook_due(escaped), delivery_id)
                pipe.zadd(_GLOBAL.webhook_sent(escaped), {delivery_id: time.time()})
                pipe.zremrangebyscore(_GLOBAL.webhook_sent(escaped), "-inf", time.time() - SENT_KEEP_S)
                await pipe.execute()
            return True
        record = {**record, "attempts": attempts, "last_error": reason}
        if not retry or attempts >= self.settings.max_attempts:
            await self._dead(escaped, delivery_id, record, reason, url=target.endpoint.url)
            return False
        wait = min(self.settings.max_backoff_s, self.settings.backoff_s * 2 ** (attempts - 1))
        wait *= random.uniform(0.5, 1.0)  # jitter: receivers that failed together are not retried together
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(_GLOBAL.webhook_deliveries(escaped), delivery_id, json.dumps(record, separators=(",", ":")))
            pipe.zadd(_GLOBAL.webhook_due(escaped), {delivery_id: time.time() + wait})
            await pipe.execute()
        return False

    async def _dead(self, escaped: str, delivery_id: str, record: dict[str, Any], reason: str, *, url: str) -> None:
        body = record.get("body") or {}
        fields = {
            "delivery": delivery_id,
            "event_id": str(body.get("id", "")),
            "type": str(body.get("type", "")),
            "session": str(body.get("session", "")),
            "url": url,
            "attempts": str(record.get("attempts", 0)),
            "reason": reason,
            "at": str(time.time()),
            "body": json.dumps(body, separators=(",", ":")),
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(_GLOBAL.webhook_dead(escaped), fields, maxlen=DEAD_MAXLEN, approximate=True)  # type: ignore[arg-type]
            pipe.hdel(_GLOBAL.webhook_deliveries(escaped), delivery_id)
            pipe.zrem(_GLOBAL.webhook_due(escaped), delivery_id)
            await pipe.execute()
        logger.warning("webhook delivery %s to %s dead-lettered: %s", delivery_id, URL(url).host or "-", reason)

    def _client(self, endpoint: WebhookEndpoint) -> tuple[aiohttp.ClientSession, AddressGuard]:
        guard = AddressGuard(endpoint.allow_networks)
        session = self._sessions.get(endpoint.allow_networks)
        if session is None:
            connector = aiohttp.TCPConnector(
                resolver=GuardedResolver(guard, self._resolver), use_dns_cache=False, limit=64
            )
            session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s),
            )
            self._sessions[endpoint.allow_networks] = session
        return session, guard

    async def _post(self, target: _Target, eid: str, kind: str, body: bytes) -> tuple[bool, str | None]:
        """Send one attempt: ``(retry, None)`` on success, else whether to retry and why it failed."""
        session, guard = self._client(target.endpoint)
        url = URL(target.endpoint.url)
        host = (url.host or "").strip("[]")
        refused = guard.refusal(host) if _is_ip(host) else None
        if refused is not None:
            return False, f"address_refused:{refused}"
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "Switchboard-Webhooks/1",
            EVENT_ID_HEADER: eid,
            "Switchboard-Event": kind,
            SIGNATURE_HEADER: sign(target.secret, int(time.time()), body),
        }
        try:
            async with session.post(url, data=body, headers=headers, allow_redirects=False) as response:
                await response.read()
                status = response.status
        except AddressRefusedError as err:
            return False, f"address_refused:{err.reason}"
        except TimeoutError:
            return True, "timeout"
        except aiohttp.ClientConnectorError as err:
            if isinstance(err.os_error, AddressRefusedError):
                return False, f"address_refused:{err.os_error.reason}"
            return True, "connection_failed"
        except aiohttp.ClientError as err:
            return True, type(err).__name__
        if 200 <= status < 300:
            return False, None
        return status >= 500 or status in _RETRIED, f"http_{status}"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
