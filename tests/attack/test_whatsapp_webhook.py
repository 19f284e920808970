"""Forged and hostile requests to the WhatsApp webhook, through the real route on the real Redis.

Every mutated signature (flipped byte, wrong secret, missing header, ``sha1=`` only, body re-encoded with raw
non-ASCII) is 401/403 with nothing written; a wrong handshake is 403; hostile signed bodies are 200 or 400, never
5xx; a token never leaks into an answer.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient

from switchboard.channels.meta.webhook import SIGNATURE_HEADER, sign
from switchboard.channels.meta.whatsapp.fake.payloads import (
    PHONE_NUMBER_ID,
    delivery,
    make_message,
    sign_request,
    text_delivery,
)
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.attack.keyspace import keyspace

SECRET = "5d41402abc4b2a76b9719d911017c592"
VERIFY = "verify-me"
TOKEN = "EAAsupersecret-never-shown"


@pytest.fixture
async def client(base_env: dict[str, str], aiohttp_client: Any) -> TestClient:
    env = base_env | {
        "SWITCHBOARD_WHATSAPP__ACCESS_TOKEN": TOKEN,
        "SWITCHBOARD_WHATSAPP__APP_SECRET": SECRET,
        "SWITCHBOARD_WHATSAPP__VERIFY_TOKEN": VERIFY,
        "SWITCHBOARD_WHATSAPP__PHONE_NUMBER_ID": PHONE_NUMBER_ID,
        "SWITCHBOARD_WHATSAPP__GRAPH_BASE_URL": "http://127.0.0.1:9/v23.0",
    }
    return await aiohttp_client(create_app(load_settings(env), listeners=False))  # type: ignore[no-any-return]


def _flip(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    at = len(body) // 2
    return body[:at] + bytes([body[at] ^ 0x01]) + body[at + 1 :], headers


def _reencoded(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    return json.dumps(json.loads(body), ensure_ascii=False).encode(), headers


MUTATIONS = {
    "flipped_byte": _flip,
    "wrong_secret": lambda b, h: (b, h | {SIGNATURE_HEADER: sign(b, "not-the-app-secret")}),
    "missing_header": lambda b, h: (b, {"Content-Type": "application/json"}),
    "sha1_only": lambda b, h: (b, {"Content-Type": "application/json", "X-Hub-Signature": "sha1=" + "ab" * 20}),
    "reencoded_non_ascii": _reencoded,
    "truncated_hex": lambda b, h: (b, h | {SIGNATURE_HEADER: h[SIGNATURE_HEADER][:-1]}),
    "non_ascii_header": lambda b, h: (b, h | {SIGNATURE_HEADER: "sha256=" + "é" * 64}),
    "empty_secret_signature": lambda b, h: (b, h | {SIGNATURE_HEADER: sign(b, "")}),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
async def test_a_mutated_signature_is_refused_and_writes_nothing(
    name: str, client: TestClient, sync_redis: redis.Redis
) -> None:
    body, headers = sign_request(text_delivery("Olá, préço? 你好"), SECRET)
    bad_body, bad_headers = MUTATIONS[name](body, headers)
    before = keyspace(sync_redis)
    resp = await client.post("/webhooks/whatsapp", data=bad_body, headers=bad_headers)
    assert resp.status in (401, 403), name
    assert keyspace(sync_redis) == before
    assert TOKEN not in await resp.text()


async def test_a_thousand_random_mutations_are_refused_never_5xx(client: TestClient, sync_redis: redis.Redis) -> None:
    rng = random.Random(9)
    body, headers = sign_request(delivery([make_message(body=f"m{i}") for i in range(3)]), SECRET)
    before = keyspace(sync_redis)
    for _ in range(1000):
        mutated = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        if bytes(mutated) == body:
            continue
        resp = await client.post("/webhooks/whatsapp", data=bytes(mutated), headers=headers)
        assert resp.status == 401
        await resp.read()
    assert keyspace(sync_redis) == before


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"null",
        b"{}",
        b'{"object": "whatsapp_business_account", "entry": "x"}',
        b'{"object": "whatsapp_business_account", "entry": [{"changes": "x"}]}',
        b'{"object": "whatsapp_business_account", "entry": [{"changes": [{"field": "messages", "value": []}]}]}',
        b'{"object": "whatsapp_business_account", "entry": [{"changes": [{"field": "messages", "value": '
        b'{"metadata": {"phone_number_id": 5}, "messages": [{"id": 1, "from": null}, "x", {"id": "w", "from": "1", '
        b'"type": "image", "image": {"id": ["x"]}}]}}]}]}',
        json.dumps({"object": "whatsapp_business_account", "entry": [{"changes": [{"field": "messages", "value": {
            "metadata": {"phone_number_id": "1" * 5000},
            "messages": [{"id": "w" * 5000, "from": "2" * 300, "type": "text", "text": {"body": 5}}]}}]}]}).encode(),
    ],
)  # fmt: skip
async def test_signed_hostile_bodies_are_200_or_400_never_5xx(
    body: bytes, client: TestClient, sync_redis: redis.Redis
) -> None:
    _, headers = sign_request(body, SECRET)
    resp = await client.post("/webhooks/whatsapp", data=body, headers=headers)
    assert resp.status in (200, 400)
    await resp.read()


async def test_a_handshake_is_never_answered_without_the_verify_token(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    before = keyspace(sync_redis)
    for params in (
        {"hub.mode": "subscribe", "hub.challenge": "42"},
        {"hub.mode": "subscribe", "hub.verify_token": VERIFY + " ", "hub.challenge": "42"},
        {"hub.mode": "subscribe", "hub.verify_token": SECRET, "hub.challenge": "42"},
        {"hub.mode": "subscribe", "hub.verify_token": "", "hub.challenge": "42"},
    ):
        resp = await client.get("/webhooks/whatsapp", params=params)
        assert resp.status == 403 and "42" not in await resp.text()
    signed_get = await client.get(
        "/webhooks/whatsapp",
        params={"hub.mode": "subscribe", "hub.challenge": "42"},
        headers={SIGNATURE_HEADER: sign(b"", SECRET)},
    )
    assert signed_get.status == 403  # a GET is a handshake: the body signature does not stand in for the token
    assert keyspace(sync_redis) == before
