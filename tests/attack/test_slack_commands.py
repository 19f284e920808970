"""Hostile slash command forms on ``/webhooks/slack``, signed for real: a clear 4xx and nothing queued, never a 500.

A field given twice is ambiguous (which ``user_id`` or ``command`` is meant depends on the reader), so the form is
refused rather than read by its first value.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest
import redis
from aiohttp.test_utils import TestClient

from switchboard.channels.slack.fake.payloads import make_slash_command, sign_request
from switchboard.core.messages import CommandIssued
from tests.channels.slack_support import SECRET
from tests.channels.test_slack_commands import FORM, client, env, fake, queued

__all__ = ["client", "env", "fake"]


@pytest.mark.parametrize(
    "extra",
    [b"&user_id=U0EVIL", b"&command=%2Freset", b"&channel_id=C0OTHER", b"&trigger_id=9.9.other", b"&text=again"],
)
async def test_a_command_with_a_field_given_twice_is_400_and_nothing_queued(
    client: TestClient, sync_redis: redis.Redis, extra: bytes
) -> None:
    before = sorted(sync_redis.keys("*"))
    body, headers = sign_request(make_slash_command("/ask", "hi") + extra, SECRET, form=True)
    resp = await client.post("/webhooks/slack", data=body, headers=FORM | headers)
    assert resp.status == 400, await resp.text()
    assert sorted(sync_redis.keys("*")) == before


@pytest.mark.parametrize(
    "fields",
    [
        {"text": "ü" * 39_000},
        {"text": "\u202egnp.exe\u200b\x1b[2J"},
        {"command": "/İstanbul"},
        {"channel_id": "C0/../x", "user_id": "U0\u200bHUMAN"},
    ],
)
async def test_odd_but_well_formed_commands_are_queued_as_data(
    client: TestClient, sync_redis: redis.Redis, fields: dict[str, Any]
) -> None:
    base = {"command": "/ask", "text": "", "user_id": "U0HUMAN", "channel_id": "C0GENERAL", "trigger_id": "1.2.t"}
    body, headers = sign_request(urlencode(base | fields).encode(), SECRET, form=True)
    resp = await client.post("/webhooks/slack", data=body, headers=FORM | headers)
    assert resp.status == 200, await resp.text()
    (message,) = queued(sync_redis)
    assert isinstance(message.event, CommandIssued)
    assert len(message.conversation.session_key.split("/")) == 5  # a slash in an id never splits the session key


async def test_a_command_text_over_its_cap_is_400(client: TestClient, sync_redis: redis.Redis) -> None:
    body, headers = sign_request(make_slash_command("/ask", "x" * 40_001), SECRET, form=True)
    resp = await client.post("/webhooks/slack", data=body, headers=FORM | headers)
    assert resp.status == 400, await resp.text()
    assert queued(sync_redis) == []
