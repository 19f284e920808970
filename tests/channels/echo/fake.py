"""The echo platform's fake API (records ``/send``) and its ``SIMULATION`` for ``run`` and ``simulate``."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from pydantic import SecretStr

from switchboard.channels.registry import FakePlatform, SampleRequest, Simulation

from .adapter import SIGNATURE_HEADER
from .settings import EchoSettings

__all__ = ["SIMULATION", "FakeEcho", "sign"]


def sign(body: bytes, secret: str) -> dict[str, str]:
    """The headers the echo platform sends with ``body``."""
    return {SIGNATURE_HEADER: hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()}


class FakeEcho(FakePlatform):
    """Records every ``POST /send``; ``GET /_fake/sent?chat=`` lists the texts sent to a chat."""

    def __init__(self) -> None:
        self.sent: list[dict[str, str]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/send", self._send)
        app.router.add_get("/_fake/sent", self._list)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def _send(self, request: web.Request) -> web.Response:
        self.sent.append(await request.json())
        return web.json_response({"id": len(self.sent)})

    async def _list(self, request: web.Request) -> web.Response:
        chat = request.query.get("chat")
        return web.json_response([s["text"] for s in self.sent if s["chat"] == chat])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def _start(block: EchoSettings) -> tuple[EchoSettings, FakePlatform]:
    fake = FakeEcho()
    url = await fake.start()
    update = {"app_id": "sim", "secret": SecretStr(secrets.token_urlsafe(16)), "api_base_url": url}
    return block.model_copy(update=update), fake


def _details(block: EchoSettings) -> dict[str, str]:
    assert block.secret is not None
    return {"fake_url": block.api_base_url, "secret": block.secret.get_secret_value()}


def _request(details: Mapping[str, str], text: str) -> SampleRequest:
    chat = f"chat-{secrets.token_hex(4)}"
    body = json.dumps({"id": secrets.token_hex(8), "chat": chat, "text": text}).encode()
    return SampleRequest(body=body, headers=sign(body, details["secret"]), conversation=chat)


async def _replies(http: aiohttp.ClientSession, details: Mapping[str, str], conversation: str) -> list[str]:
    async with http.get(f"{details['fake_url']}/_fake/sent", params={"chat": conversation}) as resp:
        return [str(text) for text in await resp.json()]


SIMULATION: Simulation[EchoSettings] = Simulation(start=_start, details=_details, request=_request, replies=_replies)
