"""Shared pieces of the Teams tests: the bot's credentials, signed activities, the sample payloads, a gateway."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient
from multidict import CIMultiDict, CIMultiDictProxy

from switchboard.channels.base import RawRequest
from switchboard.channels.teams.adapter import TeamsChannel
from switchboard.channels.teams.fake.platform import FakeTeams
from switchboard.channels.teams.settings import TeamsSettings
from switchboard.core.messages import ConversationRef
from switchboard.queue.keys import session_in
from switchboard.types import SessionKey

APP_ID = "00000000-1111-4222-8333-444444444444"
BOT_ID = "28:" + APP_ID
PASSWORD = "fake-client-secret-Zq8~"
PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "teams"
SAMPLE_SERVICE_URL = "https://smba.trafficmanager.net/amer/"
"""The service URL the payload files carry; tests replace it with the fake's (same ``/amer/`` path)."""


def teams_settings(fake: FakeTeams, **overrides: Any) -> TeamsSettings:
    values: dict[str, Any] = {
        "app_id": APP_ID,
        "app_password": PASSWORD,
        "openid_metadata_url": fake.metadata_url,
        "login_base_url": fake.base_url,
        "connector_hosts": (fake.base_url,),
    }
    return TeamsSettings.model_validate({**values, **overrides})


def teams_env(fake: FakeTeams) -> dict[str, str]:
    return {
        "SWITCHBOARD_TEAMS__APP_ID": APP_ID,
        "SWITCHBOARD_TEAMS__APP_PASSWORD": PASSWORD,
        "SWITCHBOARD_TEAMS__OPENID_METADATA_URL": fake.metadata_url,
        "SWITCHBOARD_TEAMS__LOGIN_BASE_URL": fake.base_url,
        "SWITCHBOARD_TEAMS__CONNECTOR_HOSTS": fake.base_url,
    }


def make_channel(fake: FakeTeams, *, require_mention: bool = True, **overrides: Any) -> TeamsChannel:
    return TeamsChannel(teams_settings(fake, **overrides), account="default", require_mention=require_mention)


def payload(name: str, service_url: str) -> dict[str, Any]:
    """A sample activity, pointed at ``service_url``."""
    text = (PAYLOADS / name).read_text().replace(SAMPLE_SERVICE_URL, service_url)
    data: dict[str, Any] = json.loads(text)
    return data


def signed_request(
    fake: FakeTeams, activity: dict[str, Any], *, token_url: str | None = None, **claims: Any
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of ``activity`` with a token the fake's key signed (for ``token_url``, default the
    activity's ``serviceUrl``; ``claims`` override)."""
    body = json.dumps(activity).encode()
    return body, fake.key.authorization(APP_ID, token_url or activity["serviceUrl"], **claims)


def raw(body: bytes, headers: dict[str, str]) -> RawRequest:
    return RawRequest("POST", "/webhooks/teams", CIMultiDictProxy(CIMultiDict(headers)), {}, body)


def personal(fake: FakeTeams, conversation: str = "a:1HkC_personal-chat-id") -> ConversationRef:
    extra = {"service_url": fake.service_url, "conversation_type": "personal", "bot_id": BOT_ID}
    return ConversationRef(channel="teams", conversation=conversation, extra=extra)


async def post(client: TestClient, fake: FakeTeams, activity: dict[str, Any]) -> int:
    """Post ``activity`` to the gateway's Teams webhook, signed by the fake's key; the answer's status."""
    body, headers = signed_request(fake, activity)
    resp = await client.post("/webhooks/teams", data=body, headers=headers)
    await resp.read()
    return resp.status


def session_of(inbox: str) -> SessionKey:
    """The session of an inbox key."""
    session = session_in(inbox)
    assert session is not None, inbox
    return SessionKey(session)
