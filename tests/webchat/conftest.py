"""A small web application with the web chat routes, the real Ingestor and real Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient

from switchboard.channels.web.adapter import WebChannel
from switchboard.outbound.webstream import WebStreamPublisher
from switchboard.queue.connection import async_client
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.lease import CURRENT_LEASE, Lease, LeaseToken
from switchboard.queue.router import IngestRouter
from switchboard.settings import Settings, load_settings
from switchboard.types import SessionKey
from switchboard.web.appkeys import CHANNELS, INGESTOR, METRICS, REDIS, ROUTER, SETTINGS
from switchboard.web.metrics import Metrics
from switchboard.web.webchat import access
from switchboard.web.webchat import routes as webchat


@dataclass
class SSE:
    id: str | None
    event: str | None
    data: dict[str, Any] | None
    comment: str | None = None


async def read_sse(resp: ClientResponse, count: int, *, comments: bool = False, limit_s: float = 10.0) -> list[SSE]:
    """Read ``count`` SSE events (or comments, when asked) from an open response, line by line."""
    found: list[SSE] = []
    fields: dict[str, str] = {}
    async with asyncio.timeout(limit_s):  # a guard against hanging, not a timing assertion
        while len(found) < count:
            raw = await resp.content.readline()
            if not raw:
                break
            line = raw.decode().rstrip("\n")
            if line == "":
                if "event" in fields or "data" in fields:
                    data = json.loads(fields["data"]) if "data" in fields else None
                    found.append(SSE(fields.get("id"), fields.get("event"), data))
                fields = {}
                continue
            if line.startswith(":"):
                if comments:
                    found.append(SSE(None, None, None, comment=line[1:].strip()))
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            fields[name] = fields[name] + "\n" + value if name == "data" and name in fields else value
    return found


@dataclass
class Chat:
    """The app under test plus handles a test needs."""

    client: TestClient[Any, Any]
    app: web.Application
    redis: aioredis.Redis
    settings: Settings
    publisher: WebStreamPublisher
    leases: dict[SessionKey, LeaseToken] = field(default_factory=dict)

    async def new_session(self, body: Any = None) -> tuple[str, str]:
        kwargs: dict[str, Any] = {} if body is None else {"json": body}
        resp = await self.client.post("/api/chat/sessions", **kwargs)
        assert resp.status == 201, await resp.text()
        payload = await resp.json()
        return payload["session"], payload["token"]

    async def session_key(self, token: str) -> SessionKey:
        value = await self.redis.get(GlobalKeys().web_token(access.hash_token(token)))
        assert value is not None
        return SessionKey(value.decode())

    async def post(self, token: str | None, body: Any, **kw: Any) -> ClientResponse:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", {}))
        if isinstance(body, bytes | str):
            return await self.client.post("/api/chat/messages", data=body, headers=headers, **kw)
        return await self.client.post("/api/chat/messages", json=body, headers=headers, **kw)

    async def send(self, token: str, text: str, client_id: str | None = None) -> str:
        body: dict[str, Any] = {"text": text}
        if client_id is not None:
            body["client_id"] = client_id
        resp = await self.post(token, body)
        assert resp.status == 202, await resp.text()
        return str((await resp.json())["message_id"])

    async def lease(self, session: SessionKey) -> LeaseToken:
        """Take (once) the session's lease, as a worker's drain does."""
        if session not in self.leases:
            lease = await Lease(self.redis, worker_id="test-worker", lease_ms=60_000).acquire(session)
            assert lease is not None
            self.leases[session] = lease
        return self.leases[session]

    async def as_worker(self, session: SessionKey, events: list[tuple[str, dict[str, Any]]]) -> list[str]:
        """Publish worker-side events under a real session lease, as the drain does."""
        lease = await self.lease(session)
        reset = CURRENT_LEASE.set(lease)
        try:
            return [await self.publisher.publish(session, kind, data) for kind, data in events]
        finally:
            CURRENT_LEASE.reset(reset)

    async def snapshot(self) -> dict[str, Any]:
        """Every key and its type: to show that a refused request wrote nothing."""
        keys = sorted(k.decode() for k in await self.redis.keys("*"))
        return {k: (await self.redis.type(k)).decode() for k in keys}


def build_app(
    settings: Settings, redis: aioredis.Redis, *, ingest_redis: aioredis.Redis | None = None
) -> web.Application:
    app = web.Application()
    app[SETTINGS] = settings
    app[REDIS] = redis
    app[INGESTOR] = Ingestor(ingest_redis or redis, settings.queue)
    app[METRICS] = Metrics()
    publisher = WebStreamPublisher(redis)
    app[CHANNELS] = {("web", "default"): WebChannel(publisher.publish)}
    app[ROUTER] = IngestRouter(app[INGESTOR], settings.file, app[CHANNELS].keys(), app[METRICS])
    webchat.add_routes(app)
    return app


@pytest.fixture
def settings(base_env: dict[str, str]) -> Settings:
    return load_settings(base_env)


@pytest.fixture
async def app_redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = async_client(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def chat(
    app_redis: aioredis.Redis,
    settings: Settings,
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
) -> Chat:
    # app_redis first: torn down after the client, so open streams end before their Redis client closes
    app = build_app(settings, app_redis)
    client = await aiohttp_client(app)
    return Chat(client, app, app_redis, settings, WebStreamPublisher(app_redis))
