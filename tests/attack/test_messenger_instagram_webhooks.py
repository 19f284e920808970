"""Forged and hostile requests at Messenger's and Instagram's webhook routes: 401/403/400, nothing written, no 5xx."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient

from switchboard.channels.meta.messaging.fake.payloads import sign_delivery
from switchboard.channels.meta.webhook import sign
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.attack.keyspace import keyspace
from tests.channels.test_instagram import IG_SECRET, IG_TOKEN, instagram_env
from tests.channels.test_messenger import APP_SECRET, TOKEN, gateway_env, payload

ROUTES = {"messenger": ("/webhooks/messenger", APP_SECRET), "instagram": ("/webhooks/instagram", IG_SECRET)}


@pytest.fixture
async def gateway(base_env: dict[str, str], tmp_path: Path, aiohttp_client: Any) -> TestClient:
    env = gateway_env(base_env, tmp_path, "http://127.0.0.1:9/v23.0") | instagram_env("http://127.0.0.1:9/v23.0")
    assert TOKEN and IG_TOKEN
    return await aiohttp_client(create_app(load_settings(env), listeners=False))  # type: ignore[no-any-return]


def mutations(body: bytes, secret: str, rng: random.Random) -> list[tuple[str, bytes, dict[str, str]]]:
    good = sign(body, secret)
    out: list[tuple[str, bytes, dict[str, str]]] = []
    for _ in range(120):
        flipped = bytearray(body)
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        out.append(("bit flip", bytes(flipped), {"X-Hub-Signature-256": good}))
        at = rng.randrange(7, len(good))
        changed = good[:at] + rng.choice([c for c in "0123456789abcdef" if c != good[at]]) + good[at + 1 :]
        out.append(("signature changed", body, {"X-Hub-Signature-256": changed}))
        out.append(("wrong secret", body, {"X-Hub-Signature-256": sign(body, secret + str(rng.randrange(10**6)))}))
    legacy = "sha1=" + "0" * 40
    out += [
        ("missing", body, {}),
        ("sha1 only", body, {"X-Hub-Signature": legacy}),
        ("sha1 in the sha256 header", body, {"X-Hub-Signature-256": legacy}),
        ("no prefix", body, {"X-Hub-Signature-256": good.removeprefix("sha256=")}),
        ("truncated", body, {"X-Hub-Signature-256": good[:-2]}),
        ("empty", body, {"X-Hub-Signature-256": ""}),
        ("other app's secret", body, {"X-Hub-Signature-256": sign(body, "another-apps-secret")}),
        ("non-ascii", body, {"X-Hub-Signature-256": "sha256=é" + good[8:]}),
    ]
    return out


@pytest.mark.parametrize("channel", ["messenger", "instagram"])
async def test_mutated_signatures_are_refused_and_write_nothing(
    gateway: TestClient, sync_redis: redis.Redis, channel: str
) -> None:
    path, secret = ROUTES[channel]
    body, _ = sign_delivery(payload(channel, "multi_entry.json"), secret)
    before = keyspace(sync_redis)
    statuses: dict[int, int] = {}
    for what, data, headers in mutations(body, secret, random.Random(9)):
        resp = await gateway.post(path, data=data, headers={"Content-Type": "application/json", **headers})
        assert resp.status in (401, 403), what
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
    assert statuses.get(401, 0) > 300
    assert keyspace(sync_redis) == before


@pytest.mark.parametrize("channel", ["messenger", "instagram"])
async def test_a_body_re_encoded_without_escapes_does_not_verify(
    gateway: TestClient, sync_redis: redis.Redis, channel: str
) -> None:
    """Meta signs the escaped bytes it sends; the same JSON re-serialised with raw UTF-8 is another body."""
    path, secret = ROUTES[channel]
    delivery = payload(channel, "text.json")
    escaped, headers = sign_delivery(delivery, secret)
    raw = json.dumps(delivery, ensure_ascii=False).encode()
    assert raw != escaped
    before = keyspace(sync_redis)
    resp = await gateway.post(path, data=raw, headers=headers)
    assert resp.status == 401 and keyspace(sync_redis) == before


@pytest.mark.parametrize("channel", ["messenger", "instagram"])
async def test_the_other_channels_delivery_is_refused_even_when_signed(
    gateway: TestClient, sync_redis: redis.Redis, channel: str
) -> None:
    path, secret = ROUTES[channel]
    other = "instagram" if channel == "messenger" else "messenger"
    body, headers = sign_delivery(payload(other, "text.json"), secret)
    before = keyspace(sync_redis)
    resp = await gateway.post(path, data=body, headers=headers)
    assert resp.status == 400 and keyspace(sync_redis) == before


HOSTILE: list[Any] = [
    [],
    "page",
    {"object": "page"},
    {"object": "page", "entry": {}},
    {"object": "page", "entry": [None]},
    {"object": "page", "entry": [{"id": 5}]},
    {"object": "page", "entry": [{"id": "1", "messaging": "x"}]},
    {"object": "page", "entry": [{"id": "1", "messaging": [{"sender": {}}]}]},
    {"object": "page", "entry": [{"id": "1", "messaging": [{"sender": {"id": "2"}, "message": {"mid": 7}}]}]},
    {"object": "page", "entry": [{"id": "1", "messaging": [{"sender": {"id": "2"}, "message": []}]}]},
    {"object": "page", "entry": [{"id": "1", "messaging": [{"sender": {"id": "2"}, "timestamp": "soon"}]}]},
    {"object": "page", "entry": [{"id": "1", "messaging": [{"sender": {"id": "2"}, "postback": {"payload": 1}}]}]},
    {"object": "page", "entry": [{"id": "1", "messaging": [{"sender": {"id": "2"}, "reaction": None}]}]},
    {"object": "page", "entry": [{"id": "1", "messaging": [{"sender": {"id": "2"}, "message": {"mid": "m"}}]}]},
    {
        "object": "page",
        "entry": [
            {
                "id": "1",
                "messaging": [
                    {
                        "sender": {"id": "2"},
                        "message": {"mid": "m", "attachments": [{"type": "image", "payload": {"url": 3}}]},
                    }
                ],
            }
        ],
    },
]


@pytest.mark.parametrize("index", range(len(HOSTILE)))
async def test_signed_hostile_bodies_are_400_or_acknowledged_never_5xx(
    gateway: TestClient, sync_redis: redis.Redis, index: int
) -> None:
    data = HOSTILE[index]
    for channel in ("messenger", "instagram"):
        path, secret = ROUTES[channel]
        if isinstance(data, dict) and channel == "instagram":
            data = {**data, "object": "instagram"}
        body, headers = sign_delivery(json.dumps(data).encode(), secret)
        resp = await gateway.post(path, data=body, headers=headers)
        assert resp.status in (200, 400), (channel, data, await resp.text())
    assert sync_redis.keys("sb:*:inbox") == []


async def test_random_signed_garbage_never_fails_the_route(gateway: TestClient, sync_redis: redis.Redis) -> None:
    rng = random.Random(5)
    base = json.dumps(payload("messenger", "multi_entry.json")).encode()
    for _ in range(300):
        mutated = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        body, headers = sign_delivery(bytes(mutated), APP_SECRET)
        resp = await gateway.post("/webhooks/messenger", data=body, headers=headers)
        assert resp.status in (200, 400)


async def test_handshake_is_refused_without_the_verify_token(gateway: TestClient, sync_redis: redis.Redis) -> None:
    before = keyspace(sync_redis)
    for path in ("/webhooks/messenger", "/webhooks/instagram"):
        for query in (
            {"hub.mode": "subscribe", "hub.challenge": "42"},
            {"hub.mode": "subscribe", "hub.challenge": "42", "hub.verify_token": APP_SECRET},
            {"hub.mode": "subscribe", "hub.challenge": "42", "hub.verify_token": "verify-me-pleasE"},
        ):
            resp = await gateway.get(path, params=query)
            assert resp.status == 403 and "42" not in await resp.text()
        put = await gateway.put(path, data=b"{}")
        assert put.status == 405
    assert keyspace(sync_redis) == before
