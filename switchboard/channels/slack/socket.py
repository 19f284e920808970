"""Slack Socket Mode: receive events over a websocket, for deployments without a public HTTPS URL.

Each envelope's payload goes through the same parsing as the HTTP endpoint's and is acknowledged only once durably
accepted, so an unavailable queue means Slack delivers it again. A small client on the adapter's pool: slack-sdk's
would acknowledge from its own callbacks and keep a second session. One listener per account across all processes,
so Slack's load balancing never splits an account's events between processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any, Final, Protocol

import aiohttp
from pydantic import ValidationError

from switchboard.channels.base import Emit, Inbound
from switchboard.channels.slack.api import SlackApi
from switchboard.channels.slack.inbound import WireCallback, WireCommand, WireInteraction
from switchboard.errors import DeliveryError, QueueUnavailableError, RequestError

__all__ = ["SlackSocketListener", "SocketReceiver"]

logger = logging.getLogger(__name__)

_HEARTBEAT_S: Final = 30.0
_BACKOFF_MIN_S: Final = 1.0
_BACKOFF_MAX_S: Final = 30.0


class SocketReceiver(Protocol):
    """What the listener hands envelopes to: the account's adapter (:class:`~.adapter.SlackChannel`)."""

    @property
    def account(self) -> str:
        """The account name, for log lines."""

    def receive_callback(self, callback: WireCallback) -> Inbound:
        """Parse one Events API body."""

    def receive_interaction(self, payload: WireInteraction) -> Inbound:
        """Parse one interactivity payload."""

    def receive_command(self, command: WireCommand) -> Inbound:
        """Parse one slash command."""


class SlackSocketListener:
    """One Socket Mode connection for one account (reconnecting until cancelled).

    Args:
        channel: The account's adapter (parses payloads).
        app_token: The app-level token (``xapp-…``, scope ``connections:write``).
        api: The bot's Web API client: its base URL and connection pool are shared.
    """

    def __init__(self, channel: SocketReceiver, app_token: str, api: SlackApi) -> None:
        self._channel = channel
        self._api = api
        self._app_token = app_token
        self.acked: int = 0
        """Envelopes acknowledged since start (for tests and metrics)."""

    async def _open(self) -> str:
        app = SlackApi(self._app_token, self._api.base_url, session=self._api.http())
        answer = await app.call("apps.connections.open", {})
        url = answer.get("url")
        if not isinstance(url, str) or not url.startswith(("wss://", "ws://")):
            raise DeliveryError("slack answered apps.connections.open without a websocket URL", channel="slack")
        return url

    async def listen(self, emit: Emit) -> None:
        """Receive until cancelled; reconnect after every disconnect or failure (with backoff)."""
        backoff = _BACKOFF_MIN_S
        account = self._channel.account
        while True:
            try:
                url = await self._open()
                async with self._api.http().ws_connect(url, heartbeat=_HEARTBEAT_S, autoping=True) as ws:
                    logger.info("slack account %s: socket mode connected", account)
                    backoff = _BACKOFF_MIN_S
                    await self._serve(ws, emit)
                logger.info("slack account %s: socket mode connection closed; reconnecting", account)
                continue
            except asyncio.CancelledError:
                raise
            except (DeliveryError, aiohttp.ClientError, OSError, TimeoutError, QueueUnavailableError) as exc:
                logger.warning("slack account %s: socket mode: %s; retrying in %.0f s", account, exc, backoff)
            await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse, emit: Emit) -> None:
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
                    return
                continue
            try:
                envelope = json.loads(message.data)
            except ValueError:
                logger.warning("slack account %s: socket mode sent a frame that is not JSON", self._channel.account)
                continue
            if not isinstance(envelope, dict):
                continue
            kind = envelope.get("type")
            if kind == "disconnect":
                return  # Slack asks for a new connection (refresh_requested, link_disabled, warning)
            envelope_id = envelope.get("envelope_id")
            if not isinstance(envelope_id, str):
                continue  # hello and other notices
            inbound = self._inbound(kind, envelope.get("payload"))
            if inbound is not None and inbound.messages:
                await emit(inbound)  # raises when the queue did not confirm: no ack, Slack sends it again
            await ws.send_str(json.dumps({"envelope_id": envelope_id}))
            self.acked += 1

    def _inbound(self, kind: Any, payload: Any) -> Inbound | None:
        """An envelope's payload → :class:`Inbound` (``None``: nothing to hand on; bad payloads are logged)."""
        try:
            if kind == "events_api":
                return self._channel.receive_callback(WireCallback.model_validate(payload))
            if kind == "interactive":
                return self._channel.receive_interaction(WireInteraction.model_validate(payload))
            if kind == "slash_commands":
                return self._channel.receive_command(WireCommand.model_validate(payload))
        except (ValidationError, RequestError) as exc:
            logger.warning(
                "slack account %s: socket mode %s envelope not understood (%s); acknowledged and dropped",
                self._channel.account,
                kind,
                type(exc).__name__,
            )
        return None  # other kinds: acknowledged, not handled
