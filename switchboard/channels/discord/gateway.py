"""Discord's gateway: one websocket per bot that receives messages, spoken on aiohttp.

Not discord.py's client: it cannot take another REST or gateway URL per account, and it advances its sequence number
before dispatching, so an event could not be handed to the durable ingest before the connection moves on. Here each
dispatch is emitted durably before the next frame is read and only then counted, so a failed emit resumes from the
last handled event and Discord replays it; misconfiguration close codes are retried slowly, never in a tight loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from switchboard.channels.discord.api import DiscordRest
from switchboard.errors import SwitchboardError

__all__ = ["FATAL_CLOSE_CODES", "INTENTS", "DiscordGateway"]

logger = logging.getLogger(__name__)

INTENTS = (1 << 0) | (1 << 9) | (1 << 12) | (1 << 15)
"""``GUILDS`` (threads), ``GUILD_MESSAGES``, ``DIRECT_MESSAGES`` and the privileged ``MESSAGE_CONTENT``."""
FATAL_CLOSE_CODES = {4004: "authentication failed (check the bot token)", 4010: "invalid shard", 4011: "sharding"}
FATAL_CLOSE_CODES |= {4012: "invalid API version", 4013: "invalid intents"}
FATAL_CLOSE_CODES |= {4014: "disallowed intents: enable MESSAGE CONTENT INTENT in the Developer Portal (Bot tab)"}
_NO_RESUME_CODES = {4007, 4009}
"""Invalid sequence, session timed out: identify afresh."""
_MAX_FRAME = 64 * 2**20

Handler = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Handles one dispatch (``t``, ``d``); returns once it is durably accepted, raises otherwise."""


class _Reconnect(Exception):
    def __init__(self, resume: bool, why: str) -> None:
        super().__init__(why)
        self.resume = resume


class DiscordGateway:
    """A gateway connection that reconnects and resumes by itself until cancelled.

    Args:
        rest: The account's REST client (``GET /gateway/bot`` finds the websocket URL).
        token: The bot token.
        intents: Gateway intents.
        retry_s: Backoff after a failed connection (doubled up to ``max_retry_s``).
        max_retry_s: The longest backoff (and the wait after a fatal close code).
    """

    def __init__(
        self, rest: DiscordRest, token: str, *, intents: int = INTENTS, retry_s: float = 1.0, max_retry_s: float = 60.0
    ) -> None:
        self._rest, self._token, self._intents = rest, token, intents
        self._retry_s, self._max_retry_s = retry_s, max_retry_s
        self.session_id: str | None = None
        self.sequence: int | None = None
        """The last dispatch handled (what ``RESUME`` sends)."""
        self._received: int | None = None
        """The last sequence number received (what heartbeats send)."""
        self._resume_url: str | None = None
        self._acked = True

    async def run(self, handle: Handler) -> None:
        """Connect, receive and hand dispatches to ``handle`` until cancelled."""
        delay = self._retry_s
        while True:
            try:
                await self._connect_once(handle)
                delay = self._retry_s
            except _Reconnect as again:
                logger.info("discord gateway: reconnecting (%s)", again)
                if not again.resume:
                    self.session_id = self.sequence = self._resume_url = None
                    await asyncio.sleep(random.uniform(1, 5) * self._retry_s)  # Discord asks for 1–5 s
                delay = self._retry_s
            except (
                aiohttp.ClientError,
                TimeoutError,
                OSError,
                SwitchboardError,
                ValueError,
                TypeError,
                KeyError,
            ) as exc:
                logger.warning("discord gateway: %s; retrying in %.1f s", type(exc).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_retry_s)

    async def _url(self) -> str:
        if self._resume_url and self.session_id:
            base = self._resume_url
        else:
            answer = await self._rest.request("GET", "/gateway/bot")
            base = str(answer["url"]) if isinstance(answer, dict) and answer.get("url") else ""
            if not base:
                raise ValueError("GET /gateway/bot gave no url")
        return base.rstrip("/") + "/?v=10&encoding=json"

    async def _connect_once(self, handle: Handler) -> None:
        url = await self._url()
        session = self._rest.session()
        async with session.ws_connect(url, max_msg_size=_MAX_FRAME, autoping=True, heartbeat=None) as ws:
            hello = await ws.receive_json(timeout=30)
            if hello.get("op") != 10:
                raise ValueError(f"expected HELLO, got op {hello.get('op')}")
            interval = float(hello["d"]["heartbeat_interval"]) / 1000
            self._acked = True
            beat = asyncio.create_task(self._heartbeat(ws, interval))
            try:
                await self._hello(ws)
                await self._receive(ws, handle)
            finally:
                beat.cancel()
                await asyncio.gather(beat, return_exceptions=True)
                if not ws.closed:
                    await ws.close(code=4000)  # not 1000/1001: those end the session, this one resumes

    async def _hello(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        if self.session_id and self.sequence is not None:
            resume = {"token": self._token, "session_id": self.session_id, "seq": self.sequence}
            await ws.send_json({"op": 6, "d": resume})
            return
        properties = {"os": "linux", "browser": "switchboard", "device": "switchboard"}
        identify = {"token": self._token, "intents": self._intents, "properties": properties}
        await ws.send_json({"op": 2, "d": identify})

    async def _heartbeat(self, ws: aiohttp.ClientWebSocketResponse, interval: float) -> None:
        await asyncio.sleep(interval * random.random())
        while not ws.closed:
            if not self._acked:
                logger.warning("discord gateway: no heartbeat ACK; reconnecting")
                await ws.close(code=4000)
                return
            self._acked = False
            await ws.send_json({"op": 1, "d": self._received})
            await asyncio.sleep(interval)

    async def _receive(self, ws: aiohttp.ClientWebSocketResponse, handle: Handler) -> None:
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                if frame.type == aiohttp.WSMsgType.ERROR:
                    break
                continue
            payload = json.loads(frame.data)
            op = payload.get("op")
            if op == 0:
                await self._dispatch(payload, handle)
            elif op == 1:
                await ws.send_json({"op": 1, "d": self._received})
            elif op == 11:
                self._acked = True
            elif op == 7:
                raise _Reconnect(True, "RECONNECT requested")
            elif op == 9:
                raise _Reconnect(bool(payload.get("d")), "INVALID_SESSION")
        code = ws.close_code
        if code in FATAL_CLOSE_CODES:
            logger.error("discord gateway closed %s: %s; retrying in %.0f s", code, FATAL_CLOSE_CODES[code], 60)
            await asyncio.sleep(self._max_retry_s)
            raise _Reconnect(False, f"close code {code}")
        raise _Reconnect(code not in _NO_RESUME_CODES, f"closed with {code}")

    async def _dispatch(self, payload: dict[str, Any], handle: Handler) -> None:
        seq, event, data = payload.get("s"), str(payload.get("t")), payload.get("d") or {}
        if isinstance(seq, int):
            self._received = seq
        if event == "READY":
            self.session_id = str(data["session_id"])
            self._resume_url = data.get("resume_gateway_url") or None
        try:
            await handle(event, data)
        except SwitchboardError as exc:
            # Not durably accepted: resume from the last handled event, so Discord replays this one.
            raise _Reconnect(True, f"{event} not accepted ({type(exc).__name__})") from None
        if isinstance(seq, int):
            self.sequence = seq
