"""The console's live updates: ``GET /console/api/stream``, server-sent events instead of the page polling.

Each connected console reads Redis once a second, for itself: its sessions list (with its filters) and, for the open
session, a fingerprint (the event log's last entry, the history's length, the state) that decides whether to read
and push its transcript again. Nothing is written per message for it, so a gateway with no console open pays
nothing. A stream is scoped to the operator's tenants like every read, limited per operator, keeps the connection
alive with a comment every :data:`HEARTBEAT_S`, and ends when its sign-in does (sign-out, expiry) or the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web
from redis.exceptions import RedisError

from switchboard.control import ControlError, ControlService, OperatorScope
from switchboard.errors import QueueUnavailableError
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.web.appkeys import REDIS
from switchboard.web.console.api import failure, filtered_sessions, service_of, transcript_body
from switchboard.web.console.auth import COOKIE, set_cookie
from switchboard.web.console.routes import SECURITY_HEADERS, SIGNIN, error, operator_only

__all__ = ["HEARTBEAT_S", "MAX_STREAMS_PER_OPERATOR", "STREAMS", "TICK_S", "Streams", "add_stream_routes"]

logger = logging.getLogger(__name__)

TICK_S: Final = 1.0
"""How often one stream reads Redis for changes."""
HEARTBEAT_S: Final = 15.0
"""Longest silence on a stream: a comment line then keeps proxies and the browser from closing it."""
MAX_STREAMS_PER_OPERATOR: Final = 4
"""Open streams one operator may hold in one gateway process (a tab each); one more is ``429``."""
_KEYS: Final = GlobalKeys()
_REDIS_ERRORS: Final = (QueueUnavailableError, RedisError, OSError, TimeoutError)


@dataclass
class Streams:
    """The process's open streams: a count per operator, and the event that ends them all at shutdown."""

    open: Counter[str] = field(default_factory=Counter)
    closing: asyncio.Event = field(default_factory=asyncio.Event)


STREAMS: Final = web.AppKey("console_streams", Streams)


def _frame(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n".encode()


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


class _Watch:
    """One stream's reads, and what it last pushed (so only changes go out)."""

    def __init__(self, service: ControlService, scope: OperatorScope, query: Mapping[str, str], session: str) -> None:
        self.service = service
        self.scope = scope
        self.query = query
        self.session = session
        self.sessions_digest = ""
        self.fingerprint: tuple[Any, ...] = ()

    async def sessions(self) -> list[Any] | None:
        """The sessions list when it changed since the last push, else ``None``."""
        found = await filtered_sessions(self.service, self.scope, self.query)
        digest = _digest(found)
        if digest == self.sessions_digest:
            return None
        self.sessions_digest = digest
        return list(found)

    async def transcript(self) -> dict[str, Any] | None:
        """The open session's transcript when its log, history or state changed since the last push, else ``None``."""
        if not self.session:
            return None
        key = self.scope.check(self.session)
        keys = SessionKeys(key)
        async with self.service.redis.pipeline(transaction=False) as pipe:
            pipe.xrevrange(keys.events, count=1)
            pipe.llen(keys.history)
            pipe.zcard(keys.approvals)
            last, length, pending = await pipe.execute()
        view = await self.service.session(self.scope, self.session)
        fingerprint = (repr(last), int(length), int(pending), view.state, view.controlled_by)
        if fingerprint == self.fingerprint:
            return None
        self.fingerprint = fingerprint
        return await transcript_body(self.service, self.scope, self.session)


async def _signed_in(request: web.Request, token_hash: str | None) -> bool:
    if token_hash is None:  # a proxy sign-in without a cookie yet: the proxy vouches for each new stream
        return True
    return bool(await request.app[REDIS].exists(_KEYS.console_login(token_hash)))


async def stream(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/stream?session=&channel=&agent=&tenant=&state=``: ``sessions`` and ``transcript`` events."""
    signin = request[SIGNIN]
    streams = request.app[STREAMS]
    name = signin.operator.name
    if streams.open[name] >= MAX_STREAMS_PER_OPERATOR:
        return error(429, "too_many_streams", f"at most {MAX_STREAMS_PER_OPERATOR} live consoles per operator")
    service, scope = service_of(request)
    watch = _Watch(service, scope, request.query, request.query.get("session", ""))
    try:  # refuse a bad filter or session with a clear status, before the stream starts
        first_sessions = await watch.sessions()
        first_transcript = await watch.transcript()
    except (ControlError, *_REDIS_ERRORS) as err:
        return failure(err)
    token = signin.new_token or request.cookies.get(COOKIE)
    token_hash = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest() if token else None
    response = web.StreamResponse(
        headers={**SECURITY_HEADERS, "Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
    )
    if signin.new_token is not None:
        set_cookie(request, response, signin.new_token)
    streams.open[name] += 1
    try:
        await response.prepare(request)
        await response.write(f"retry: {int(TICK_S * 3000)}\n\n".encode())
        await response.write(_frame("sessions", first_sessions))
        if first_transcript is not None:
            await response.write(_frame("transcript", first_transcript))
        quiet_since = time.monotonic()
        while not streams.closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(streams.closing.wait(), TICK_S)
            if streams.closing.is_set():
                break
            try:
                if not await _signed_in(request, token_hash):
                    await response.write(_frame("signed_out", {"reason": "the sign-in ended"}))
                    break
                frames = []
                if (found := await watch.sessions()) is not None:
                    frames.append(_frame("sessions", found))
                if (body := await watch.transcript()) is not None:
                    frames.append(_frame("transcript", body))
            except ControlError as err:  # the open session is gone or out of scope
                frames = [_frame("problem", {"message": str(err)})]
                watch.session = ""
            except _REDIS_ERRORS:
                frames = [_frame("problem", {"message": "Redis did not answer in time; retrying"})]
            if frames:
                await response.write(b"".join(frames))
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= HEARTBEAT_S:
                await response.write(b": heartbeat\n\n")
                quiet_since = time.monotonic()
    except (ConnectionResetError, ConnectionError):
        pass  # the browser went away
    finally:
        streams.open[name] -= 1
        if streams.open[name] <= 0:
            del streams.open[name]
    return response


async def _close_streams(app: web.Application) -> None:
    app[STREAMS].closing.set()


def add_stream_routes(app: web.Application) -> None:
    """Register ``GET /console/api/stream`` on ``app`` and end its streams when the server shuts down."""
    app[STREAMS] = Streams()
    app.on_shutdown.append(_close_streams)
    app.router.add_get("/console/api/stream", operator_only(stream))
