"""A fake WhatsApp Cloud API (Graph API): a small aiohttp app speaking the real wire format.

It checks WhatsApp's limits, answers with Meta's shapes and error codes, closes the 24-hour window on request and
records every call; :class:`FakeWhatsApp` lists its routes, error injection and inspection.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from switchboard.channels.meta.fake import FakeGraphServer
from switchboard.channels.meta.whatsapp.fake.payloads import PHONE_NUMBER_ID, sign_request, text_delivery
from switchboard.channels.meta.whatsapp.settings import WhatsAppSettings
from switchboard.channels.registry import FakePlatform, SampleRequest, Simulation

__all__ = ["SIMULATION", "FakeCall", "FakeWhatsApp", "FakeWhatsAppState", "meta_error"]

_ERRORS: dict[int, tuple[int, str, str]] = {
    131047: (400, "OAuthException", "Re-engagement message"),
    130429: (400, "OAuthException", "Rate limit hit"),
    131056: (400, "OAuthException", "(Business Account, Consumer Account) pair rate limit hit"),
    190: (401, "OAuthException", "Error validating access token: Session has expired"),
    131026: (400, "OAuthException", "Message Undeliverable"),
    100: (400, "OAuthException", "Invalid parameter"),
    131000: (500, "OAuthException", "Something went wrong"),
}


def meta_error(code: int, *, subcode: int | None = None, status: int | None = None) -> tuple[int, dict[str, Any]]:
    """``(HTTP status, body)`` of a Graph API error with ``code``, as Meta shapes it."""
    default_status, kind, message = _ERRORS.get(code, (400, "OAuthException", "Error"))
    error: dict[str, Any] = {"message": f"({code}) {message}", "type": kind, "code": code, "fbtrace_id": "AfakeTrace"}
    if subcode is not None:
        error["error_subcode"] = subcode
    return status or default_status, {"error": error}


@dataclass
class FakeCall:
    """One request the fake received."""

    method: str
    path: str
    body: dict[str, Any]
    status: int
    authorization: str

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly copy (without the authorization header)."""
        return {"method": self.method, "path": self.path, "body": self.body, "status": self.status}


@dataclass
class _Planned:
    code: int
    subcode: int | None
    status: int | None
    path_suffix: str | None
    after: int = 0


@dataclass
class FakeWhatsAppState:
    """What the fake received and what it will answer."""

    token: str | None = None
    base_url: str = ""
    calls: list[FakeCall] = field(default_factory=list)
    plan: list[_Planned] = field(default_factory=list)
    closed: set[str] = field(default_factory=set)
    media: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    """Media id → where ``/_fake/media/{id}`` redirects (tests of what a download may follow)."""
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def record(self, call: FakeCall) -> None:
        """Keep a call and wake waiters."""
        self.calls.append(call)
        self._changed.set()
        self._changed = asyncio.Event()

    def sent(self, kind: str | None = None, to: str | None = None) -> list[dict[str, Any]]:
        """Bodies of successful ``/messages`` sends (of ``type`` ``kind``, to ``to``), in order."""
        return [
            c.body
            for c in self.calls
            if c.path.endswith("/messages")
            and c.status == 200
            and "status" not in c.body
            and (kind is None or c.body.get("type") == kind)
            and (to is None or c.body.get("to") == to)
        ]

    def texts(self, to: str | None = None) -> list[str]:
        """What each successful send showed (text body, interactive body, template name)."""
        shown = []
        for body in self.sent(to=to):
            kind = body.get("type")
            if kind == "text":
                shown.append(str(body["text"]["body"]))
            elif kind == "interactive":
                shown.append(str(body["interactive"]["body"]["text"]))
            elif kind == "template":
                shown.append(f"[template {body['template']['name']}]")
            else:
                shown.append(f"[{kind}]")
        return shown

    def new_id(self, prefix: str) -> str:
        """A fresh id."""
        return f"{prefix}{next(self._ids):08d}{secrets.token_hex(4).upper()}"


FAKE_STATE = web.AppKey("fake_whatsapp", FakeWhatsAppState)


def _check_message(body: dict[str, Any]) -> str | None:
    """Why Meta would refuse this message body (code 100), or ``None``."""
    if body.get("messaging_product") != "whatsapp":
        return "messaging_product must be whatsapp"
    if "status" in body:
        return None if body.get("status") == "read" and body.get("message_id") else "status needs message_id"
    if not isinstance(body.get("to"), str) or not body["to"]:
        return "to is required"
    kind = body.get("type")
    part = body.get(kind) if isinstance(kind, str) else None
    if not isinstance(part, dict):
        return f"{kind} object is required"
    if kind == "text":
        text = part.get("body")
        return None if isinstance(text, str) and 0 < len(text) <= 4096 else "text.body must be 1-4096 characters"
    if kind == "interactive":
        return _check_interactive(part)
    if kind == "template":
        return None if part.get("name") and isinstance(part.get("language"), dict) else "template needs name, language"
    if kind in ("image", "video", "audio", "document", "sticker"):
        return None if part.get("id") or part.get("link") else f"{kind} needs id or link"
    return f"unsupported type {kind}"


def _check_interactive(part: dict[str, Any]) -> str | None:
    text = part.get("body", {}).get("text") if isinstance(part.get("body"), dict) else None
    if not isinstance(text, str) or not 0 < len(text) <= 1024:
        return "interactive.body.text must be 1-1024 characters"
    action: dict[str, Any] = part["action"] if isinstance(part.get("action"), dict) else {}
    if part.get("type") == "button":
        buttons = action.get("buttons")
        if not isinstance(buttons, list) or not 1 <= len(buttons) <= 3:
            return "action.buttons must hold 1-3 buttons"
        for button in buttons:
            reply = button.get("reply", {}) if isinstance(button, dict) else {}
            if not 0 < len(str(reply.get("title", ""))) <= 20 or not 0 < len(str(reply.get("id", ""))) <= 256:
                return "button title must be 1-20 characters and id 1-256"
        return None
    if part.get("type") == "list":
        rows = [r for s in action.get("sections", []) for r in s.get("rows", [])]
        if not 1 <= len(rows) <= 10 or not 0 < len(str(action.get("button", ""))) <= 20:
            return "a list holds 1-10 rows and a button label of 1-20 characters"
        if any(not 0 < len(str(r.get("title", ""))) <= 24 or len(str(r.get("description", ""))) > 72 for r in rows):
            return "row titles are 1-24 characters, descriptions at most 72"
        return None
    return "interactive.type must be button or list"


async def _graph(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    path = request.path
    auth = request.headers.get("Authorization", "")
    body: dict[str, Any] = {}
    upload: tuple[bytes, str] | None = None
    if request.method == "POST" and request.content_type.startswith("multipart/"):
        async for part in await request.multipart():
            if isinstance(part, aiohttp.BodyPartReader):
                if part.name == "file":
                    upload = (bytes(await part.read()), part.headers.get("Content-Type", "application/octet-stream"))
                else:
                    body[str(part.name)] = await part.text()
    elif request.method == "POST":
        try:
            loaded = await request.json()
        except ValueError:
            loaded = None
        body = loaded if isinstance(loaded, dict) else {"_invalid": True}

    def answer(status: int, payload: dict[str, Any]) -> web.Response:
        state.record(FakeCall(request.method, path, body, status, auth))
        return web.json_response(payload, status=status)

    if state.token is not None and auth != f"Bearer {state.token}":
        return answer(*meta_error(190))
    for index, planned in enumerate(state.plan):
        if planned.path_suffix is None or path.endswith(planned.path_suffix):
            if planned.after > 0:
                planned.after -= 1
                break
            del state.plan[index]
            return answer(*meta_error(planned.code, subcode=planned.subcode, status=planned.status))
    node = request.match_info["node"]
    if request.method == "GET":
        found = state.media.get(node)
        if found is None:
            return answer(*meta_error(100, subcode=33))
        return answer(
            200,
            {
                "messaging_product": "whatsapp",
                "url": f"{state.base_url}/_fake/media/{node}",
                "mime_type": found[1],
                "sha256": hashlib.sha256(found[0]).hexdigest(),
                "file_size": len(found[0]),
                "id": node,
            },
        )
    if request.match_info.get("edge") == "media":
        if upload is None or body.get("messaging_product") != "whatsapp":
            return answer(*meta_error(100))
        media_id = state.new_id("")
        state.media[media_id] = upload
        body["_file_bytes"] = len(upload[0])
        return answer(200, {"id": media_id})
    problem = _check_message(body)
    if problem is not None:
        status, error = meta_error(100)
        error["error"]["message"] = f"(#100) {problem}"
        return answer(status, error)
    if "status" in body:
        return answer(200, {"success": True})
    to = str(body["to"])
    if to in state.closed and body.get("type") != "template":
        return answer(*meta_error(131047))
    return answer(
        200,
        {
            "messaging_product": "whatsapp",
            "contacts": [{"input": to, "wa_id": to}],
            "messages": [{"id": "wamid." + state.new_id("OUT")}],
        },
    )


async def _media(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    if state.token is not None and request.headers.get("Authorization") != f"Bearer {state.token}":
        return web.Response(status=401)
    media_id = request.match_info["media_id"]
    if media_id in state.redirects:
        raise web.HTTPFound(state.redirects[media_id])
    found = state.media.get(media_id)
    if found is None:
        return web.Response(status=404)
    return web.Response(body=found[0], content_type=found[1])


async def _calls(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    return web.json_response([c.to_json() for c in state.calls])


async def _messages(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    return web.json_response([{"text": t} for t in state.texts(request.query.get("to"))])


def create_fake_whatsapp(token: str | None = None) -> web.Application:
    """The fake as an aiohttp application (``token=None`` accepts any)."""
    app = web.Application(client_max_size=100 * 2**20)
    app[FAKE_STATE] = FakeWhatsAppState(token=token)
    app.router.add_get("/_fake/calls", _calls)
    app.router.add_get("/_fake/messages", _messages)
    app.router.add_get("/_fake/media/{media_id}", _media)
    app.router.add_post("/{version}/{node}/{edge}", _graph)
    app.router.add_get("/{version}/{node}", _graph)
    return app


class FakeWhatsApp(FakeGraphServer[FakeWhatsAppState]):
    """Runs the fake on a loopback port; :attr:`graph_url` is the ``SWITCHBOARD_WHATSAPP__GRAPH_BASE_URL``.

    ``POST /{version}/{phone_number_id}/messages`` (``Authorization: Bearer``, JSON) takes text (≤ 4,096 characters),
    interactive buttons (1–3, titles ≤ 20, ids ≤ 256) and lists (≤ 10 rows, row titles ≤ 24), templates, media by id,
    and the read receipt with ``typing_indicator``; it answers ``{"messaging_product", "contacts", "messages": [{"id":
    "wamid…"}]}`` or Meta's error object (``{"error": {"message", "type", "code", "error_subcode", "fbtrace_id"}}``).
    ``POST /{version}/{phone_number_id}/media`` (multipart) stores an upload and answers its id; ``GET /{version}/
    {media_id}`` answers the media's URL (served, with the token only, from ``/_fake/media/{id}``).

    Error injection: :meth:`FakeWhatsApp.fail_next` answers the next calls with a Meta error code (131047 outside
    the window, 130429 throttled, 190 bad token, 131026 undeliverable, or any other); :meth:`FakeWhatsApp.close_window`
    makes every free-form message to a user fail with 131047 (templates still pass), as WhatsApp does after 24 h.
    Inspection: :attr:`FakeWhatsAppState.calls`, ``GET /_fake/calls`` and ``GET /_fake/messages?to=`` (the texts a
    user received, for ``switchboard simulate``).
    """

    def __init__(self, token: str | None = None) -> None:
        app = create_fake_whatsapp(token)
        super().__init__(app, app[FAKE_STATE])

    @property
    def graph_url(self) -> str:
        """The Graph API root with its version."""
        return f"{self.base_url}/v23.0"

    def fail_next(
        self,
        code: int,
        count: int = 1,
        *,
        subcode: int | None = None,
        status: int | None = None,
        path_suffix: str | None = "/messages",
        after: int = 0,
    ) -> None:
        """Answer ``count`` calls (paths ending with ``path_suffix``) with error ``code``, after ``after`` pass."""
        self.state.plan.extend(_Planned(code, subcode, status, path_suffix, after) for _ in range(count))

    def close_window(self, user: str) -> None:
        """Refuse free-form messages to ``user`` with 131047 from now on (templates pass)."""
        self.state.closed.add(user)

    def host_media(self, content: bytes, mime_type: str = "image/jpeg") -> str:
        """Make ``content`` downloadable as a user's media; returns its media id."""
        media_id = self.state.new_id("")
        self.state.media[media_id] = (content, mime_type)
        return media_id

    def redirect_media(self, location: str) -> str:
        """A media id whose download URL redirects to ``location`` (anywhere: for tests of what a fetch follows)."""
        media_id = self.host_media(b"", "image/jpeg")
        self.state.redirects[media_id] = location
        return media_id

    def media_url(self, media_id: str) -> str:
        """Where the fake serves ``media_id``'s bytes (the ``url`` its media lookup answers)."""
        return f"{self.base_url}/_fake/media/{media_id}"


# ---------------------------------------------------------------- switchboard run / simulate


async def _sim_start(settings: WhatsAppSettings) -> tuple[WhatsAppSettings, FakePlatform]:
    fake = FakeWhatsApp()
    await fake.start()
    block = WhatsAppSettings(
        access_token="EAAfake" + secrets.token_hex(16),
        app_secret=secrets.token_hex(16),
        verify_token=secrets.token_hex(8),
        phone_number_id=PHONE_NUMBER_ID,
        graph_base_url=fake.graph_url,
    )
    return block, fake


def _sim_details(settings: WhatsAppSettings) -> dict[str, str]:
    secret = settings.app_secret.get_secret_value() if settings.app_secret else ""
    fake_url = settings.graph_base_url.rsplit("/", 1)[0]
    return {"fake_url": fake_url, "app_secret": secret, "phone_number_id": settings.phone_number_id or ""}


def _sim_request(details: Mapping[str, str], text: str) -> SampleRequest:
    user = "1555" + "".join(secrets.choice("0123456789") for _ in range(7))
    payload = text_delivery(text, sender=user, phone_number_id=details.get("phone_number_id") or PHONE_NUMBER_ID)
    body, headers = sign_request(json.dumps(payload).encode(), details["app_secret"])
    return SampleRequest(body=body, headers=headers, conversation=user)


async def _sim_replies(http: aiohttp.ClientSession, details: Mapping[str, str], conversation: str) -> list[str]:
    async with http.get(f"{details['fake_url'].rstrip('/')}/_fake/messages", params={"to": conversation}) as resp:
        found = await resp.json()
    return [str(m["text"]) for m in found]


SIMULATION: Simulation[WhatsAppSettings] = Simulation(
    start=_sim_start, details=_sim_details, request=_sim_request, replies=_sim_replies
)
"""How ``switchboard run`` fakes WhatsApp without credentials, and how ``switchboard simulate whatsapp`` talks to
it."""
