"""A fake Bot Framework: the Connector a bot posts to, Entra's token endpoint, and the OpenID metadata with its keys.

One aiohttp app speaking the real wire formats, minting the tokens tests and ``switchboard simulate`` send and
recording every call with the service-URL path it came under; :class:`FakeTeams` lists its routes, failure injection
and inspection routes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from switchboard.channels.fakes import FakeServer, found_within, wait_for_change
from switchboard.channels.registry import FakePlatform, SampleRequest, Simulation
from switchboard.channels.teams.fake.tokens import ISSUER, SigningKey, make_activity, mention
from switchboard.channels.teams.settings import TeamsSettings

__all__ = ["SIMULATION", "FakeCall", "FakeTeams", "SigningKey", "make_activity", "mention"]

_ids = itertools.count(1)


@dataclass
class FakeCall:
    """One Connector call the fake received."""

    seq: int
    method: str
    prefix: str
    """The service-URL path it came under (``/amer/``)."""
    conversation: str
    activity_id: str | None
    """The activity replied to or updated (``None`` for a new activity)."""
    body: dict[str, Any]
    status: int
    time: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        """The call as ``/_fake/calls`` lists it."""
        return {
            "seq": self.seq,
            "method": self.method,
            "prefix": self.prefix,
            "conversation": self.conversation,
            "activity_id": self.activity_id,
            "body": self.body,
            "status": self.status,
            "time": self.time,
        }


@dataclass
class _Planned:
    status: int
    retry_after: float | None = None
    delay_s: float = 0.0


class FakeTeams(FakeServer):
    """Runs the fake on a loopback port.

    - ``GET /v1/.well-known/openidconfiguration`` → ``jwks_uri`` → ``GET /v1/.well-known/keys``: the public half of a
      local RSA key (:class:`~switchboard.channels.teams.fake.tokens.SigningKey`, endorsed for ``msteams``) that mints
      the tokens the tests and ``switchboard simulate`` send with their activities;
    - ``POST /{tenant}/oauth2/v2.0/token``: the client-credentials grant (checks the app id, the secret and the scope)
      → a bearer token for the Connector;
    - ``POST {path}/v3/conversations/{id}/activities`` (a new activity), ``POST …/activities/{id}`` (a reply) and
      ``PUT …/activities/{id}`` (an update) under any service-URL path (``/amer/``), with the issued token only; each
      answers ``{"id": …}``. ``typing`` activities are recorded too. Every call is kept (:attr:`FakeTeams.calls`) with
      the path prefix it came under, so a test sees where a reply went.

    Failure injection: :meth:`FakeTeams.fail_next` (any status, ``Retry-After``), :meth:`FakeTeams.slow_next`.
    Inspection for ``simulate`` and the benchmark: ``GET /_fake/calls?since=&conversation=&wait=`` and
    ``GET /_fake/messages?conversation=`` (each message's current text).

    Args:
        app_id: The bot's app id the token endpoint accepts (``None``: any).
        app_password: The secret it accepts (``None``: any).
        key: The signing key the metadata publishes (a fresh one by default).
    """

    def __init__(self, app_id: str | None = None, app_password: str | None = None, key: SigningKey | None = None):
        self.app_id = app_id
        self.app_password = app_password
        self.key = key or SigningKey()
        self.extra_keys: list[SigningKey] = []
        self.calls: list[FakeCall] = []
        self.token_requests = 0
        self.metadata_requests = 0
        self.keys_requests = 0
        self.messages: dict[tuple[str, str], str] = {}
        """(conversation, activity id) → the message's current text."""
        self._tokens: set[str] = set()
        self._plan: list[_Planned] = []
        self._changed = asyncio.Event()
        self.app = web.Application(client_max_size=4 * 2**20)
        self.app.router.add_get("/v1/.well-known/openidconfiguration", self._metadata)
        self.app.router.add_get("/v1/.well-known/keys", self._keys)
        self.app.router.add_post("/{tenant}/oauth2/v2.0/token", self._token)
        base = r"/{prefix:(?:[^/]+/)*}v3/conversations/{conversation}/activities"
        self.app.router.add_post(base, self._activity)
        self.app.router.add_post(base + "/{activity}", self._activity)
        self.app.router.add_put(base + "/{activity}", self._activity)
        self.app.router.add_get("/_fake/calls", self._calls)
        self.app.router.add_get("/_fake/messages", self._messages)

    # ---------------------------------------------------------------- configuration

    @property
    def metadata_url(self) -> str:
        """``SWITCHBOARD_TEAMS__OPENID_METADATA_URL`` to configure."""
        return f"{self.base_url}/v1/.well-known/openidconfiguration"

    @property
    def service_url(self) -> str:
        """A service URL with a regional path, as Teams sends (``…/amer/``)."""
        return f"{self.base_url}/amer/"

    def sent(self, conversation: str | None = None, *, kind: str = "message") -> list[FakeCall]:
        """Successful new activities of ``kind`` (``message``, ``typing``), optionally in one conversation."""
        return [
            c
            for c in self.calls
            if c.method == "POST"
            and c.status < 300
            and c.body.get("type") == kind
            and (conversation is None or c.conversation == conversation)
        ]

    def updates(self, conversation: str | None = None) -> list[FakeCall]:
        """Successful updates (``PUT``), optionally in one conversation."""
        return [
            c for c in self.calls if c.method == "PUT" and c.status < 300 and conversation in (None, c.conversation)
        ]

    def fail_next(self, count: int, *, status: int = 429, retry_after: float | None = 1.0) -> None:
        """Answer the next ``count`` Connector calls with ``status`` (and ``Retry-After``)."""
        self._plan.extend(_Planned(status, retry_after) for _ in range(count))

    def slow_next(self, count: int, *, delay_s: float) -> None:
        """Answer the next ``count`` Connector calls normally, after ``delay_s`` seconds."""
        self._plan.extend(_Planned(0, delay_s=delay_s) for _ in range(count))

    async def wait_for(self, predicate: Any, within_s: float = 5.0) -> None:
        """Wait until ``predicate()`` holds (after calls arrive)."""
        await wait_for_change(predicate, lambda: self._changed, within_s)

    def _record(self, call: FakeCall) -> None:
        self.calls.append(call)
        self._changed.set()
        self._changed = asyncio.Event()

    # ---------------------------------------------------------------- handlers

    async def _metadata(self, request: web.Request) -> web.Response:
        self.metadata_requests += 1
        return web.json_response(
            {
                "issuer": ISSUER,
                "authorization_endpoint": "https://invalid.botframework.com",
                "jwks_uri": f"{self.base_url}/v1/.well-known/keys",
                "id_token_signing_alg_values_supported": ["RS256"],
                "token_endpoint_auth_methods_supported": ["private_key_jwt"],
            }
        )

    async def _keys(self, request: web.Request) -> web.Response:
        self.keys_requests += 1
        return web.json_response({"keys": [k.jwk() for k in (self.key, *self.extra_keys)]})

    async def _token(self, request: web.Request) -> web.Response:
        self.token_requests += 1
        form = await request.post()
        if (
            form.get("grant_type") != "client_credentials"
            or form.get("scope") != "https://api.botframework.com/.default"
        ):
            return web.json_response({"error": "invalid_request"}, status=400)
        if (self.app_id is not None and form.get("client_id") != self.app_id) or (
            self.app_password is not None and form.get("client_secret") != self.app_password
        ):
            return web.json_response({"error": "invalid_client"}, status=401)
        token = "fake-bot-token-" + secrets.token_hex(12)
        self._tokens.add(token)
        return web.json_response(
            {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}
        )

    async def _activity(self, request: web.Request) -> web.Response:
        prefix = "/" + request.match_info["prefix"]
        conversation = request.match_info["conversation"]
        activity_id = request.match_info.get("activity")
        seq = len(self.calls) + 1
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._record(FakeCall(seq, request.method, prefix, conversation, activity_id, {}, 400))
            return web.json_response(
                {"error": {"code": "BadArgument", "message": "body is not an activity"}}, status=400
            )
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in self._tokens:
            self._record(FakeCall(seq, request.method, prefix, conversation, activity_id, body, 401))
            return web.json_response({"message": "Authorization has been denied for this request."}, status=401)
        if self._plan:
            planned = self._plan.pop(0)
            if planned.delay_s:
                await asyncio.sleep(planned.delay_s)
            if planned.status:
                self._record(FakeCall(seq, request.method, prefix, conversation, activity_id, body, planned.status))
                headers = {"Retry-After": f"{planned.retry_after:g}"} if planned.retry_after is not None else None
                return web.json_response({"error": {"code": "Throttled"}}, status=planned.status, headers=headers)
        if request.method == "PUT":
            assert activity_id is not None
            if (conversation, activity_id) not in self.messages:
                self._record(FakeCall(seq, "PUT", prefix, conversation, activity_id, body, 404))
                return web.json_response({"error": {"code": "ActivityNotFoundInConversation"}}, status=404)
            self.messages[(conversation, activity_id)] = str(body.get("text") or "")
            self._record(FakeCall(seq, "PUT", prefix, conversation, activity_id, body, 200))
            return web.json_response({"id": activity_id})
        new_id = f"1:{next(_ids):06d}"
        if body.get("type") == "message":
            self.messages[(conversation, new_id)] = str(body.get("text") or _card_text(body))
        self._record(FakeCall(seq, "POST", prefix, conversation, activity_id, body, 201))
        return web.json_response({"id": new_id}, status=201)

    async def _calls(self, request: web.Request) -> web.Response:
        try:
            since, wait = int(request.query.get("since", "0")), min(float(request.query.get("wait", "0")), 30.0)
        except ValueError:
            return web.json_response({"error": "since must be an integer and wait a number"}, status=400)
        conversation = request.query.get("conversation")

        def matching() -> list[FakeCall]:
            return [c for c in self.calls[since:] if conversation in (None, c.conversation)]

        found = await found_within(matching, lambda: self._changed, wait)
        return web.json_response([c.to_json() for c in found])

    async def _messages(self, request: web.Request) -> web.Response:
        conversation = request.query.get("conversation", "")
        found = [(i, text) for (c, i), text in self.messages.items() if c == conversation]
        return web.json_response([{"id": i, "text": text} for i, text in sorted(found)])


def _card_text(body: dict[str, Any]) -> str:
    """The text an Adaptive Card shows (its text blocks and button titles), for ``/_fake/messages``."""
    texts: list[str] = []
    for attachment in body.get("attachments") or []:
        content = attachment.get("content") if isinstance(attachment, dict) else None
        if isinstance(content, dict):
            texts += [str(b.get("text", "")) for b in content.get("body", []) if isinstance(b, dict)]
            texts += [f"[{a.get('title', '')}]" for a in content.get("actions", []) if isinstance(a, dict)]
    return " ".join(t for t in texts if t)


# ---------------------------------------------------------------- switchboard run / simulate

_RUNNING: dict[str, FakeTeams] = {}
"""Fakes ``switchboard run`` started in this process, by URL: their signing key goes into ``simulate.json``."""


async def _sim_start(settings: TeamsSettings) -> tuple[TeamsSettings, FakePlatform]:
    app_id = f"{secrets.token_hex(4)}-0000-4000-8000-{secrets.token_hex(6)}"
    password = secrets.token_urlsafe(24)
    fake = FakeTeams(app_id=app_id, app_password=password)
    await fake.start()
    _RUNNING[fake.base_url] = fake
    block = TeamsSettings(
        app_id=app_id,
        app_password=password,
        openid_metadata_url=fake.metadata_url,
        login_base_url=fake.base_url,
        connector_hosts=(fake.base_url,),
    )
    return block, fake


def _sim_details(settings: TeamsSettings) -> dict[str, str]:
    fake_url = settings.login_base_url.rstrip("/")
    fake = _RUNNING.get(fake_url)
    details = {"fake_url": fake_url, "app_id": settings.app_id or ""}
    if fake is not None:
        details.update(signing_key=fake.key.pem, kid=fake.key.kid)
    return details


def _sim_request(details: Mapping[str, str], text: str) -> SampleRequest:
    key = SigningKey(details["kid"], pem=details["signing_key"])
    service_url = f"{details['fake_url']}/amer/"
    conversation = f"a:1sim-{secrets.token_hex(6)}"
    activity = make_activity(text, service_url=service_url, app_id=details["app_id"], conversation=conversation)
    body = json.dumps(activity).encode()
    return SampleRequest(
        body=body, headers=key.authorization(details["app_id"], service_url), conversation=conversation
    )


async def _sim_replies(http: aiohttp.ClientSession, details: Mapping[str, str], conversation: str) -> list[str]:
    async with http.get(f"{details['fake_url']}/_fake/messages", params={"conversation": conversation}) as resp:
        messages = await resp.json()
    return [str(m["text"]) for m in messages]


SIMULATION: Simulation[TeamsSettings] = Simulation(
    start=_sim_start, details=_sim_details, request=_sim_request, replies=_sim_replies
)
"""How ``switchboard run`` fakes Teams without credentials, and how ``switchboard simulate teams`` talks to it."""
