"""A fake Graph API Send API for Messenger and Instagram: a small aiohttp app speaking the real wire format.

It answers sends and ``GET /me`` with Meta's shapes and errors, stands in for Meta's media CDN, and records every
call; :class:`FakeMessenger` lists its routes, failure injection and inspection routes.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any, Literal

import aiohttp
from aiohttp import web

from switchboard.channels.meta.fake import FakeGraphServer
from switchboard.channels.meta.messaging.adapter import MessagingBlock
from switchboard.channels.meta.messaging.fake.payloads import (
    IG_ACCOUNT_ID,
    PAGE_ID,
    make_delivery,
    sign_delivery,
    text_item,
)
from switchboard.channels.meta.messaging.fake.state import (
    FAKE_STATE,
    FakeCall,
    FakeGraphState,
    Flavour,
    Planned,
    graph_error,
)
from switchboard.channels.meta.messenger.settings import MessengerSettings
from switchboard.channels.registry import FakePlatform, SampleRequest, Simulation

__all__ = [
    "GRAPH_VERSION",
    "SIMULATION",
    "FakeCall",
    "FakeGraphState",
    "FakeMessenger",
    "sim_details",
    "sim_replies",
    "sim_request",
]

GRAPH_VERSION = "v23.0"


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_type == "application/json":
        body = await request.json()
        return body if isinstance(body, dict) else {}
    found: dict[str, Any] = {}
    async for part in await request.multipart():
        if not isinstance(part, aiohttp.BodyPartReader) or part.name is None:
            continue
        if part.filename is not None:
            data = bytes(await part.read())
            found[part.name] = {
                "filename": part.filename,
                "size": len(data),
                "content_type": part.headers.get("Content-Type", ""),
            }
            continue
        value = await part.text()
        try:
            found[part.name] = json.loads(value) if value[:1] in ("{", "[") else value
        except ValueError:
            found[part.name] = value
    return found


async def _messages(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    path = request.path
    try:
        body = await _body(request)
    except (ValueError, aiohttp.ClientError):
        state.record(path, {}, 400, 100)
        return graph_error("(#100) body is not JSON or a form", 100)
    token = request.headers.get("Authorization", "").removeprefix("Bearer ") or request.query.get("access_token", "")
    if not state.accepts(token):
        state.record(path, body, 400, 190)
        return graph_error("Invalid OAuth access token - Cannot parse access token", 190)
    if state.plan:
        planned = state.plan.pop(0)
        if planned.delay_s:
            await asyncio.sleep(planned.delay_s)
        if planned.status:
            state.record(path, body, planned.status, planned.code)
            return graph_error("injected failure", planned.code, planned.subcode, planned.status)
    if isinstance(body.get("message"), dict) and "filedata" in body:
        attachment = body["message"].get("attachment")
        if isinstance(attachment, dict):
            attachment.setdefault("payload", {})["uploaded"] = body["filedata"]
    refusal = state.check(body)
    if refusal is not None:
        answer = json.loads(refusal.body) if isinstance(refusal.body, bytes) else {}
        state.record(path, body, refusal.status, answer.get("error", {}).get("code"))
        return refusal
    recipient = body["recipient"]["id"]
    state.record(path, body, 200, None)
    if "sender_action" in body:
        return web.json_response({"recipient_id": recipient})
    answer = {"recipient_id": recipient, "message_id": state.next_mid()}
    if "filedata" in body:
        answer["attachment_id"] = str(1000 + len(state.calls))
    return web.json_response(answer)


async def _me(request: web.Request) -> web.Response:
    """``GET /{version}/me``: the Page or Instagram account the token belongs to."""
    state = request.app[FAKE_STATE]
    token = request.headers.get("Authorization", "").removeprefix("Bearer ") or request.query.get("access_token", "")
    if not state.accepts(token):
        state.record(request.path, {}, 400, 190)
        return graph_error("Invalid OAuth access token - Cannot parse access token", 190)
    state.record(request.path, {}, 200, None)
    if state.flavour == "messenger":
        return web.json_response({"id": state.accounts.get(token) or PAGE_ID, "name": "Fake Page"})
    account = state.accounts.get(token) or IG_ACCOUNT_ID
    fields = request.query.get("fields", "id").split(",")
    if "user_id" in fields:  # Instagram Login: the app-scoped id and the professional account's id
        return web.json_response({"id": "app-scoped-" + account, "user_id": account})
    if "instagram_business_account" in fields:  # Facebook Login: the Page, and the account linked to it
        return web.json_response({"id": PAGE_ID, "instagram_business_account": {"id": account}})
    return web.json_response({"id": PAGE_ID, "name": "Fake Page"})


async def _cdn(request: web.Request) -> web.Response:
    found = request.app[FAKE_STATE].hosted.get(request.match_info["name"])
    if found is None:
        return web.Response(status=404, text="URL signature expired")
    return web.Response(body=found[0], content_type=found[1])


async def _lookaside(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    raise web.HTTPFound(request.app[FAKE_STATE].redirects.get(name, f"/_fake/cdn/{name}"))


async def _calls(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    try:
        since = int(request.query.get("since", "0"))
    except ValueError:
        return web.json_response({"error": "since must be an integer"}, status=400)
    return web.json_response([c.to_json() for c in state.calls[since:]])


async def _texts(request: web.Request) -> web.Response:
    """``GET /_fake/messages?recipient=ID``: the text of every message delivered to that user, in order."""
    state = request.app[FAKE_STATE]
    recipient = request.query.get("recipient", "")
    found = [c.body["message"].get("text", "") for c in state.delivered(recipient)]
    return web.json_response([{"text": text} for text in found])


def create_fake_graph(flavour: Flavour, token: str | None = None) -> web.Application:
    """The fake as an aiohttp application (``token`` ``None`` accepts any)."""
    app = web.Application(client_max_size=64 * 2**20)
    app[FAKE_STATE] = FakeGraphState(flavour=flavour, token=token)
    app.router.add_post("/{version}/{node}/messages", _messages)
    app.router.add_get("/{version}/me", _me)
    app.router.add_get("/_fake/cdn/{name}", _cdn)
    app.router.add_get("/_fake/lookaside/{name}", _lookaside)
    app.router.add_get("/_fake/calls", _calls)
    app.router.add_get("/_fake/messages", _texts)
    return app


class FakeMessenger(FakeGraphServer[FakeGraphState]):
    """Runs the fake on a loopback port; :attr:`graph_url` is the ``GRAPH_BASE_URL`` to configure.

    ``POST /{version}/{me | page-or-account-id}/messages`` (``Authorization: Bearer`` or ``?access_token=``) takes a
    JSON body (text, quick replies, an attachment by URL, or a ``sender_action`` alone) or a multipart form
    (``recipient``, ``message``, ``messaging_type`` … as JSON strings, and the file in ``filedata``) and answers
    ``{"recipient_id", "message_id"}`` (``{"recipient_id"}`` for a sender action), or Meta's errors: code 190 for a
    wrong token, 100 for bodies Meta refuses (see :mod:`~switchboard.channels.meta.messaging.fake.state`), 10/2018278
    outside a
    closed messaging window. ``GET /{version}/me`` names the Page of the token (with
    ``fields=instagram_business_account``, the Instagram account linked to it; with ``fields=user_id``, as
    Instagram Login's API answers, the account itself).

    Inbound media stand-ins: ``/_fake/cdn/<name>`` serves what :meth:`FakeMessenger.host_media` stored (no token,
    like Meta's signed CDN URLs) and ``/_fake/lookaside/<name>`` redirects there (as ``lookaside.fbsbx.com`` does).

    Failure injection: :meth:`FakeMessenger.fail_next` (any status and Graph error code, e.g. 613 throttling, 190
    auth, 100/2018001 no such user, 500), :meth:`FakeMessenger.slow_next`, :meth:`FakeGraphState.close_window`.
    Inspection for ``simulate``: ``GET /_fake/calls?since=`` and ``GET /_fake/messages?recipient=`` (texts sent).

    Args:
        flavour: ``messenger`` or ``instagram`` (their text limits and ``messaging_type`` rule differ).
        token: The access token it accepts (``None``: any).
    """

    def __init__(self, flavour: Flavour = "messenger", token: str | None = None) -> None:
        app = create_fake_graph(flavour, token)
        super().__init__(app, app[FAKE_STATE])

    @property
    def graph_url(self) -> str:
        """The Graph API root with its version (``GRAPH_BASE_URL``)."""
        return f"{self.base_url}/{GRAPH_VERSION}"

    @property
    def calls(self) -> list[FakeCall]:
        """Every call received, in order."""
        return self.state.calls

    def delivered(self, recipient: str | None = None) -> list[FakeCall]:
        """Messages accepted (not sender actions), optionally to one recipient."""
        return self.state.delivered(recipient)

    def texts(self, recipient: str) -> list[str]:
        """The texts delivered to ``recipient``, in order."""
        return [str(c.body["message"].get("text", "")) for c in self.delivered(recipient)]

    def fail_next(self, count: int, *, code: int, subcode: int | None = None, status: int = 400) -> None:
        """Answer the next ``count`` calls with a Graph error (``status``, ``code``, ``subcode``)."""
        self.state.plan.extend(Planned(status, code, subcode) for _ in range(count))

    def slow_next(self, count: int, *, delay_s: float) -> None:
        """Answer the next ``count`` calls normally, after ``delay_s`` seconds."""
        self.state.plan.extend(Planned(0, 0, delay_s=delay_s) for _ in range(count))

    def host_media(self, name: str, content: bytes, mime_type: str = "image/jpeg", *, redirect: bool = False) -> str:
        """Serve ``content`` as an inbound attachment's CDN URL (``redirect``: behind a lookaside redirect)."""
        self.state.hosted[name] = (content, mime_type)
        return f"{self.base_url}/_fake/{'lookaside' if redirect else 'cdn'}/{name}"

    def redirect_media(self, name: str, location: str) -> str:
        """A lookaside URL that redirects to ``location`` (anywhere: for tests of what a fetch may follow)."""
        self.state.redirects[name] = location
        return f"{self.base_url}/_fake/lookaside/{name}"


# ---------------------------------------------------------------- switchboard run / simulate


async def _sim_start(settings: MessengerSettings) -> tuple[MessengerSettings, FakePlatform]:
    fake = FakeMessenger("messenger")
    await fake.start()
    block = MessengerSettings.model_validate(
        {
            "page_access_token": "EAAfake" + secrets.token_hex(12),
            "app_secret": secrets.token_hex(16),
            "verify_token": secrets.token_hex(8),
            "graph_base_url": fake.graph_url,
            "page_id": PAGE_ID,
        }
    )
    return block, fake


def sim_details(settings: MessagingBlock, account_id: str) -> dict[str, str]:
    """What ``simulate`` needs of a faked account: the fake's URL, the app secret to sign with, the account's id."""
    secret = settings.app_secret.get_secret_value() if settings.app_secret else ""
    return {"fake_url": settings.graph_base_url.rsplit("/", 1)[0], "app_secret": secret, "account_id": account_id}


def sim_request(
    kind: Literal["page", "instagram"], first_user: int
) -> Callable[[Mapping[str, str], str], SampleRequest]:
    """A signed delivery (``object: kind``) of a text from a new user (ids from ``first_user`` on) to the account."""

    def request(details: Mapping[str, str], text: str) -> SampleRequest:
        user = str(first_user + secrets.randbelow(10**15))
        item = text_item(text, user=user, account=details["account_id"])
        body, headers = sign_delivery(make_delivery(kind, [(details["account_id"], [item])]), details["app_secret"])
        return SampleRequest(body=body, headers=headers, conversation=user)

    return request


def _sim_details(settings: MessengerSettings) -> dict[str, str]:
    return sim_details(settings, settings.page_id or PAGE_ID)


async def sim_replies(http: aiohttp.ClientSession, details: Mapping[str, str], conversation: str) -> list[str]:
    """The texts the fake delivered to ``conversation`` (a PSID or IGSID)."""
    url = f"{details['fake_url'].rstrip('/')}/_fake/messages"
    async with http.get(url, params={"recipient": conversation}) as resp:
        messages = await resp.json()
    return [str(m["text"]) for m in messages]


SIMULATION: Simulation[MessengerSettings] = Simulation(
    start=_sim_start, details=_sim_details, request=sim_request("page", 7_000_000_000_000_000), replies=sim_replies
)
"""How ``switchboard run`` fakes Messenger without credentials, and how ``switchboard simulate messenger`` talks
to it."""
