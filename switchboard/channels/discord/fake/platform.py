"""A fake Discord: the REST API routes Switchboard uses and the gateway, recording every call.

Like Discord it refuses what Discord refuses, dedups on ``nonce`` and enforces per-route rate-limit buckets, so a
client that ignores them gets 429s; :class:`FakeDiscord` lists its routes, failure injection and inspection routes.
The gateway is :mod:`~switchboard.channels.discord.fake.gateway` at ``/gateway``.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from aiohttp import web

from switchboard.channels.discord.fake.gateway import FakeGateway
from switchboard.channels.discord.fake.payloads import (
    bot_token,
    make_command,
    make_component,
    make_message,
    make_ping,
    sign_interaction,
    signing_key,
    snowflake,
)
from switchboard.channels.discord.fake.rest import FakeCall, FakeDiscordApi, FakeDiscordState
from switchboard.channels.discord.settings import DiscordSettings
from switchboard.channels.fakes import FakeServer, found_within
from switchboard.channels.registry import FakePlatform, SampleRequest, Simulation

__all__ = [
    "FAKE_DISCORD",
    "SIMULATION",
    "FakeCall",
    "FakeDiscord",
    "FakeDiscordState",
    "bot_token",
    "make_command",
    "make_component",
    "make_message",
    "make_ping",
    "sign_interaction",
    "signing_key",
]

FAKE_DISCORD: web.AppKey[FakeDiscordState] = web.AppKey("fake_discord_state", FakeDiscordState)
FAKE_GATEWAY: web.AppKey[FakeGateway] = web.AppKey("fake_discord_gateway", FakeGateway)


async def _calls(request: web.Request) -> web.Response:
    state = request.app[FAKE_DISCORD]
    since = int(request.query.get("since", "0") or 0)
    channel, token = request.query.get("channel_id"), request.query.get("token")
    wait = min(float(request.query.get("wait", "0") or 0), 30.0)

    def matching() -> list[FakeCall]:
        return [
            c
            for c in state.calls
            if c.seq > since
            and c.status < 400
            and (channel is None or c.channel_id == channel)
            and (token is None or c.token == token)
        ]

    found = await found_within(matching, lambda: state._changed, wait)
    return web.json_response([c.to_json() for c in found])


async def _messages(request: web.Request) -> web.Response:
    """The messages of a channel as they stand now (after edits), oldest first."""
    return web.json_response(request.app[FAKE_DISCORD].sent(request.query.get("channel_id")))


async def _gateway(request: web.Request) -> web.StreamResponse:
    return await request.app[FAKE_GATEWAY].handle(request)


async def _cdn(request: web.Request) -> web.Response:
    found = request.app[FAKE_DISCORD].files.get(request.match_info["name"])
    if found is None:
        return web.Response(status=404, text="Not Found")
    return web.Response(body=found[0], content_type=found[1])


def create_fake_discord(
    token: str | None = None, *, bot_id: str = "880000000000000001", application_id: str = "900"
) -> web.Application:
    """The fake as an aiohttp application. ``token=None`` accepts any bot token."""
    app = web.Application(client_max_size=30 * 2**20)
    bot = {
        "id": bot_id,
        "username": "switchboard",
        "global_name": None,
        "discriminator": "0",
        "avatar": None,
        "bot": True,
        "public_flags": 0,
        "flags": 0,
        "mfa_enabled": False,
        "verified": True,
    }
    owner = {"id": "100", "username": "owner", "global_name": None, "discriminator": "0", "avatar": None}
    application = {
        "id": application_id,
        "name": "Switchboard",
        "description": "",
        "icon": None,
        "bot_public": False,
        "bot_require_code_grant": False,
        "owner": owner,
        "verify_key": "",
        "bot": bot,
        "flags": 0,
    }
    state = FakeDiscordState(token=token, bot=bot, application=application)
    app[FAKE_DISCORD] = state
    app[FAKE_GATEWAY] = FakeGateway(token=token, user=bot, application_id=application_id)
    api = FakeDiscordApi(state)
    app.router.add_get("/gateway", _gateway)
    app.router.add_get("/gateway/", _gateway)
    app.router.add_route("*", "/api/v10/{path:.*}", api.handle)
    app.router.add_get("/_fake/calls", _calls)
    app.router.add_get("/_fake/messages", _messages)
    app.router.add_get("/_fake/cdn/{name}", _cdn)
    return app


class FakeDiscord(FakeServer):
    """Runs the fake on a loopback port: ``api_url`` is what ``SWITCHBOARD_DISCORD__API_BASE_URL`` takes.

    REST under ``/api/v10``: ``GET /users/@me``, ``/applications/@me``, ``/gateway/bot``; ``POST
    /channels/{id}/messages`` (JSON or multipart with ``payload_json``), ``PATCH /channels/{id}/messages/{id}``,
    ``POST /channels/{id}/typing``; ``PUT /applications/{id}/commands``; interaction answers (``POST
    /interactions/{id}/{token}/callback``, ``GET``/``PATCH /webhooks/{app}/{token}/messages/{id|@original}``, ``POST
    /webhooks/{app}/{token}``). Like Discord it refuses what Discord refuses (content over 2,000 characters, an empty
    message, a nonce over 25 characters, more than five rows of five buttons, labels over 80, repeated or over-long
    custom ids) and returns the *existing* message for a repeated ``nonce`` with ``enforce_nonce`` (within five
    minutes, same author). Every answer carries ``X-RateLimit-*`` headers of a per-route, per-channel bucket
    (:attr:`FakeDiscordState.bucket_limit` per :attr:`~FakeDiscordState.bucket_window` seconds): a client that
    ignores them gets 429s. Tests can plan 429s (with bucket headers, optionally global), 5xx and slow answers.

    An interaction token the fake was not told about (:meth:`FakeDiscordState.interaction`) is taken as one answered
    with a deferred response (its ``@original`` "thinking"); tokens ``sim-<channel>`` belong to that channel.
    Inspection routes: ``GET /_fake/calls?since=&channel_id=&token=&wait=``, ``GET /_fake/messages?channel_id=`` (as
    they stand after edits) and ``GET /_fake/cdn/{name}`` (files
    registered with :meth:`FakeDiscordState.add_file`). The gateway is :mod:`~switchboard.channels.discord.fake.gateway`
    at ``/gateway``.
    """

    def __init__(self, token: str | None = None, *, bot_id: str = "880000000000000001", application_id: str = "900"):
        self.app = create_fake_discord(token, bot_id=bot_id, application_id=application_id)
        self.state = self.app[FAKE_DISCORD]
        self.gateway = self.app[FAKE_GATEWAY]
        self.api_url = ""

    @property
    def calls(self) -> list[FakeCall]:
        """Every REST call received, in order."""
        return self.state.calls

    def file_url(self, name: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Serve ``data`` like a CDN attachment; returns its URL."""
        return self.base_url + self.state.add_file(name, data, content_type)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0 picks a free port); returns the API base URL (``…/api/v10``)."""
        await super().start(host, port)
        return self.api_url

    def serving(self, host: str, port: int) -> None:  # noqa: D102
        self.api_url = f"{self.base_url}/api/v10"
        self.gateway.url = f"ws://{host}:{port}/gateway"
        self.state.gateway_url = self.gateway.url

    async def closing(self) -> None:
        """Close gateway connections."""
        await self.gateway.close(1001)


# ``switchboard run`` without Discord credentials: the fake, and ``switchboard simulate discord TEXT`` against it
# (a signed ``/ask TEXT`` slash command to the interactions endpoint; the reply is the fake's ``@original`` edit).

_SIGNING_KEYS: dict[str, str] = {}
"""Public key → private key of the simulations started in this process (fake credentials)."""


async def _simulation_start(settings: DiscordSettings) -> tuple[DiscordSettings, FakePlatform]:
    fake = FakeDiscord()
    api_url = await fake.start()
    key = signing_key()
    public = key.verify_key.encode().hex()
    _SIGNING_KEYS[public] = bytes(key).hex()
    update = {
        "bot_token": bot_token(str(fake.state.bot["id"])),
        "public_key": public,
        "application_id": str(fake.state.application["id"]),
        "api_base_url": api_url,
    }
    return DiscordSettings.model_validate({**settings.model_dump(), **update}), fake


def _simulation_details(settings: DiscordSettings) -> dict[str, str]:
    return {
        "fake_url": settings.api_base_url.removesuffix("/api/v10"),
        "signing_key": _SIGNING_KEYS.get(settings.public_key or "", ""),
        "application_id": settings.application_id or "",
    }


def _simulation_request(details: Mapping[str, str], text: str) -> SampleRequest:
    from nacl.signing import SigningKey

    channel = snowflake()
    interaction = make_command(
        "ask", text, application_id=details["application_id"], channel_id=channel, guild_id=None, token=f"sim-{channel}"
    )
    body, headers = sign_interaction(interaction, SigningKey(bytes.fromhex(details["signing_key"])))
    return SampleRequest(body=body, headers=headers, conversation=channel)


async def _simulation_replies(http: aiohttp.ClientSession, details: Mapping[str, str], conversation: str) -> list[str]:
    url = details["fake_url"].rstrip("/") + "/_fake/messages"
    async with http.get(url, params={"channel_id": conversation}) as resp:
        messages = await resp.json()
    return [str(m["content"]) for m in messages if m.get("content")]


SIMULATION: Simulation[DiscordSettings] = Simulation(
    start=_simulation_start, details=_simulation_details, request=_simulation_request, replies=_simulation_replies
)
"""How ``switchboard run`` fakes Discord, and how ``switchboard simulate discord`` speaks to it."""
