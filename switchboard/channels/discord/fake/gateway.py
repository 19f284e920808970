"""A fake Discord gateway: a websocket speaking HELLO / IDENTIFY / READY / RESUME / heartbeats / dispatches.

A test pushes dispatches with :meth:`FakeGateway.dispatch` (buffered for the session until a client is connected,
so none is lost between connections, and replayed after a ``RESUME`` from the sequence number the client sends),
and can drop the connection, ask for a reconnect (op 7), invalidate the session (op 9) or stop answering
heartbeats (a zombie connection). Everything the client sent is recorded.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

__all__ = ["FakeGateway"]


@dataclass
class _Session:
    id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    """Every dispatch of the session, in order (``s`` is its index + 1)."""


@dataclass
class FakeGateway:
    """The gateway's state; :meth:`handle` is the aiohttp websocket handler."""

    token: str | None
    user: dict[str, Any]
    application_id: str
    heartbeat_interval_ms: int = 41250
    ack_heartbeats: bool = True
    url: str = ""
    """The websocket URL (set when the fake starts)."""
    received: list[dict[str, Any]] = field(default_factory=list)
    """Every payload a client sent (tokens included: the fake's own)."""
    identifies: int = 0
    resumes: int = 0
    heartbeats: int = 0
    session: _Session | None = None
    _socket: web.WebSocketResponse | None = None
    _sent_upto: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while a client is identified or resumed on the current session."""

    async def dispatch(self, event: str, data: dict[str, Any]) -> int:
        """Send (or buffer) one dispatch on the current session; returns its sequence number."""
        if self.session is None:
            self.session = _Session(id=secrets.token_hex(8))
        self.session.events.append({"op": 0, "t": event, "d": data, "s": len(self.session.events) + 1})
        await self._flush()
        return len(self.session.events)

    async def _flush(self) -> None:
        socket, session = self._socket, self.session
        if socket is None or session is None or socket.closed or not self.ready.is_set():
            return
        while self._sent_upto < len(session.events):
            self._sent_upto += 1
            await socket.send_json(session.events[self._sent_upto - 1])

    async def close(self, code: int = 4000) -> None:
        """Drop the connection with ``code`` (4000: resumable; 4004: bad token; 4014: disallowed intents)."""
        socket = self._socket
        self.ready.clear()
        if socket is not None and not socket.closed:
            await socket.close(code=code)

    async def send_op(self, op: int, data: Any = None) -> None:
        """Send a control opcode (7 RECONNECT, 9 INVALID_SESSION with ``data`` resumable, 1 HEARTBEAT request)."""
        if self._socket is not None and not self._socket.closed:
            await self._socket.send_json({"op": op, "d": data})

    async def wait_ready(self, within_s: float = 10) -> None:
        """Wait until a client has identified (or resumed)."""
        await asyncio.wait_for(self.ready.wait(), within_s)

    def _ready_event(self, session: _Session) -> dict[str, Any]:
        data = {
            "v": 10,
            "user": self.user,
            "guilds": [],
            "session_id": session.id,
            "resume_gateway_url": self.url,
            "application": {"id": self.application_id, "flags": 0},
        }
        return {"op": 0, "t": "READY", "d": data, "s": 1}

    async def _start(self, socket: web.WebSocketResponse, sent_upto: int, resumed: bool) -> None:
        self._socket, self._sent_upto = socket, sent_upto
        self.ready.set()
        await self._flush()
        if resumed:
            await socket.send_json({"op": 0, "t": "RESUMED", "d": {}, "s": None})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """One client connection."""
        socket = web.WebSocketResponse(autoping=True)
        await socket.prepare(request)
        await socket.send_json({"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval_ms}})
        try:
            async for frame in socket:
                if frame.type != WSMsgType.TEXT:
                    continue
                payload = frame.json()
                self.received.append(payload)
                await self._handle(socket, payload)
        finally:
            if self._socket is socket:
                self.ready.clear()
                self._socket = None
        return socket

    async def _handle(self, socket: web.WebSocketResponse, payload: dict[str, Any]) -> None:
        op, data = payload.get("op"), payload.get("d") or {}
        if op == 1:
            self.heartbeats += 1
            if self.ack_heartbeats:
                await socket.send_json({"op": 11})
        elif op == 2:
            self.identifies += 1
            if self.token is not None and data.get("token") != self.token:
                await socket.close(code=4004, message=b"Authentication failed.")
                return
            old = self.session
            unsent = [e for e in old.events[self._sent_upto :] if e["t"] != "READY"] if old else []
            fresh = _Session(id=secrets.token_hex(8))
            fresh.events = [self._ready_event(fresh), *unsent]
            for index, event in enumerate(fresh.events):
                event["s"] = index + 1
            self.session = fresh
            await self._start(socket, 0, resumed=False)
        elif op == 6:
            self.resumes += 1
            session = self.session
            token_ok = self.token is None or data.get("token") == self.token
            if session is None or data.get("session_id") != session.id or not token_ok:
                await socket.send_json({"op": 9, "d": False})
                return
            await self._start(socket, min(int(data.get("seq") or 0), len(session.events)), resumed=True)
