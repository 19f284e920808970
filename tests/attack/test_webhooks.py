"""Hostile requests at the webhook routes of Telegram, Slack and Discord, through ``create_app`` on real Redis.

Every request here is signed for real (the attacker is a platform account, or holds a leaked secret), or forged
(an impostor): bad authentication is 401/403, a malformed body 400, and in both cases nothing is written (a DUMP
of every key is compared before and after), no answer is a 5xx, and no ERROR is logged. Handshakes (Slack's
``url_verification``, Discord's PING) are never answered before the signature checks out.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient

from switchboard.channels.discord.fake.platform import (
    FakeDiscord,
    make_command,
    make_component,
    make_ping,
    sign_interaction,
)
from switchboard.channels.slack.fake.payloads import make_block_actions, make_event, sign, sign_request
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.channels._discord_fixtures import APP_ID, KEY, PUBLIC_KEY
from tests.channels._discord_fixtures import TOKEN as DISCORD_TOKEN
from tests.channels.slack_support import BOT_TOKEN as SLACK_TOKEN
from tests.channels.slack_support import SECRET as SLACK_SECRET
from tests.fakes.telegram_api import FakeTelegram, make_update, sign_update

TELEGRAM_TOKEN = "123456:attack-telegram-token"
TELEGRAM_SECRET = "attack-secret-token-value"
HOSTILE_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    10**30,
    -(10**30),
    1e308,
    "",
    "\x00",
    "\u202e\u0000\ud7ff",
    "x" * 70_000,
    [],
    [None],
    {},
    {"": None},
    [[[[[[[[[[[]]]]]]]]]]],
]


def dump_keyspace(r: redis.Redis) -> dict[bytes, bytes | None]:
    """Every key and its serialised value (``DUMP``)."""
    return {key: r.dump(key) for key in sorted(r.keys("*"))}


def written(before: dict[bytes, bytes | None], after: dict[bytes, bytes | None]) -> dict[bytes, str]:
    """Keys created or changed between two dumps (a key that only vanished expired: that is no write)."""
    return {
        key: "created" if key not in before else "changed"
        for key, value in after.items()
        if value is not None and before.get(key) != value
    }


@pytest.fixture
async def platforms() -> AsyncIterator[tuple[FakeTelegram, FakeSlack, FakeDiscord]]:
    async with (
        FakeTelegram(token=TELEGRAM_TOKEN, username="attack_bot") as telegram,
        FakeSlack(bot_token=SLACK_TOKEN) as slack,
        FakeDiscord(DISCORD_TOKEN, application_id=APP_ID) as discord,
    ):
        yield telegram, slack, discord


@pytest.fixture
async def client(
    base_env: dict[str, str], platforms: tuple[FakeTelegram, FakeSlack, FakeDiscord], aiohttp_client: Any
) -> TestClient:
    telegram, slack, discord = platforms
    env = base_env | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TELEGRAM_TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": TELEGRAM_SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram.base_url,
        "SWITCHBOARD_SLACK__BOT_TOKEN": SLACK_TOKEN,
        "SWITCHBOARD_SLACK__SIGNING_SECRET": SLACK_SECRET,
        "SWITCHBOARD_SLACK__API_BASE_URL": slack.api_url,
        "SWITCHBOARD_DISCORD__BOT_TOKEN": DISCORD_TOKEN,
        "SWITCHBOARD_DISCORD__PUBLIC_KEY": PUBLIC_KEY,
        "SWITCHBOARD_DISCORD__APPLICATION_ID": APP_ID,
        "SWITCHBOARD_DISCORD__API_BASE_URL": discord.api_url,
        "SWITCHBOARD_DISCORD__GATEWAY": "false",
    }
    return await aiohttp_client(create_app(load_settings(env), listeners=False))  # type: ignore[no-any-return]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document (the root excluded)."""
    found: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in items:
        found.append((*prefix, key))
        found += _paths(child, (*prefix, key))
    return found


def _set(document: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        document = document[key]
    document[path[-1]] = value


def mutants(payload: dict[str, Any], rng: random.Random, count: int) -> list[dict[str, Any]]:
    """``payload`` with one field (anywhere) replaced by a hostile value, a wrong type or a deep nesting."""
    paths = _paths(payload)
    out = []
    for index in range(count):
        mutant = copy.deepcopy(payload)
        path = paths[index % len(paths)]
        value = copy.deepcopy(rng.choice(HOSTILE_VALUES))
        if index % 7 == 0:
            value = json.loads("[" * 600 + "]" * 600)  # deep, but JSON our side can still write
        _set(mutant, path, value)
        out.append(mutant)
    return out


Signer = Callable[[dict[str, Any]], tuple[bytes, dict[str, str]]]


def _telegram(update: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    return sign_update(update, TELEGRAM_SECRET)


def _slack(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    return sign_request(payload, SLACK_SECRET, form=payload.get("type") == "block_actions")


def _discord(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    return sign_interaction(payload, KEY)


SAMPLES: list[tuple[str, Signer, Callable[[], dict[str, Any]]]] = [
    ("telegram", _telegram, lambda: make_update("hello", 42, 7001)),
    ("slack", _slack, lambda: make_event("hello there")),
    ("slack", _slack, lambda: make_block_actions("opt-1")),
    ("discord", _discord, lambda: make_command("ask", "status?", application_id=APP_ID)),
    (
        "discord",
        _discord,
        lambda: make_component("deploy:no", message={"id": "5", "channel_id": "300", "content": "Pick"}),
    ),
]


@pytest.mark.parametrize(("channel", "signer", "sample"), SAMPLES, ids=lambda v: v if isinstance(v, str) else "")
async def test_signed_hostile_bodies_are_read_or_refused_cleanly(
    client: TestClient,
    sync_redis: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    channel: str,
    signer: Signer,
    sample: Callable[[], dict[str, Any]],
) -> None:
    """Every field of a genuine payload, replaced in turn by a wrong type or a hostile value, signed for real."""
    caplog.set_level(logging.WARNING)
    rng = random.Random(f"{channel}-{sample().get('type', 'update')}")
    statuses: dict[int, int] = {}
    for mutant in mutants(sample(), rng, 240):
        body, headers = signer(mutant)
        before = dump_keyspace(sync_redis)
        resp = await client.post(f"/webhooks/{channel}", data=body, headers=headers)
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        assert resp.status in (200, 400, 413), (resp.status, await resp.text(), json.dumps(mutant)[:300])
        if resp.status != 200:
            assert written(before, dump_keyspace(sync_redis)) == {}, json.dumps(mutant)[:300]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage()[:200] for r in errors]
    assert statuses.get(400), statuses  # the table did reach the adapters' refusals


BROKEN_BODIES = [
    b"",
    b"{",
    b"null",
    b"[]",
    b'"str"',
    b"1e999999",
    b"NaN",
    b"\xff\xfe\x00{",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    json.dumps({"type": "event_callback", "event": [1] * 100_000}).encode(),
]


@pytest.mark.parametrize("body", BROKEN_BODIES, ids=lambda b: repr(b[:12]))
@pytest.mark.parametrize("channel", ["telegram", "slack", "discord"])
async def test_signed_broken_json_is_400_and_writes_nothing(
    client: TestClient, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture, channel: str, body: bytes
) -> None:
    caplog.set_level(logging.WARNING)
    signers = {
        "telegram": lambda: sign_update({}, TELEGRAM_SECRET)[1],
        "slack": lambda: sign_request(body, SLACK_SECRET)[1],
        "discord": lambda: sign_interaction(body, KEY)[1],
    }
    headers = signers[channel]()
    before = dump_keyspace(sync_redis)
    resp = await client.post(f"/webhooks/{channel}", data=body, headers=headers)
    assert resp.status in (400, 413), (resp.status, await resp.text())
    assert written(before, dump_keyspace(sync_redis)) == {}
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_slack_form_payloads_with_broken_json_are_400(client: TestClient, sync_redis: redis.Redis) -> None:
    before = dump_keyspace(sync_redis)
    for body in (
        b"payload=%7B",
        b"payload=null",
        b"payload=%5B%5D",
        b"payload=" + b"%5B" * 20_000,
        b"payload=%7B%22type%22%3A%22block_actions%22%2C%22actions%22%3A" + b"%5B%7B%7D%2C" * 5000 + b"%5D%7D",
        b"payload=%ff%fe",
        b"a=1&" * 200 + b"payload=%7B%7D",
        b"%%%%",
    ):
        body, headers = sign_request(body, SLACK_SECRET)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        resp = await client.post("/webhooks/slack", data=body, headers=headers)
        assert resp.status in (200, 400), (body[:40], resp.status)
    assert written(before, dump_keyspace(sync_redis)) == {}


async def test_slack_replay_with_a_fresh_timestamp_or_another_body_is_refused(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    body, headers = sign_request(make_event("pay Mallory"), SLACK_SECRET)
    other = json.dumps(make_event("pay Eve")).encode()
    now = int(time.time())
    forged = [
        (body, headers | {"X-Slack-Request-Timestamp": str(now + 5)}),  # old signature, fresh timestamp
        (other, headers),  # a signature over one body on another
        (body, headers | {"X-Slack-Request-Timestamp": "\u0661" * 10}),  # Arabic-Indic digits
        (body, headers | {"X-Slack-Request-Timestamp": "9" * 15}),
        (body, headers | {"X-Slack-Request-Timestamp": "-" + str(now)}),
        (body, headers | {"X-Slack-Signature": "v0=" + "é" * 64}),
        (body, headers | {"X-Slack-Signature": headers["X-Slack-Signature"].upper()}),
        (body, headers | {"X-Slack-Signature": "v0=" + "a" * 7000}),
        (body, headers | {"X-Slack-Signature": headers["X-Slack-Signature"] + "0"}),
        (body, {"X-Slack-Signature": sign(SLACK_SECRET, "", body), "X-Slack-Request-Timestamp": ""}),
    ]
    before = dump_keyspace(sync_redis)
    for forged_body, forged_headers in forged:
        resp = await client.post(
            "/webhooks/slack",
            data=forged_body,
            headers={k: v.encode().decode("latin-1") for k, v in forged_headers.items()},
        )
        assert resp.status in (400, 401, 403), (forged_headers, resp.status)
    assert written(before, dump_keyspace(sync_redis)) == {}
    assert (await client.post("/webhooks/slack", data=body, headers=headers)).status == 200  # the genuine one


async def test_handshakes_are_never_answered_before_authenticity(client: TestClient, sync_redis: redis.Redis) -> None:
    challenge = {"token": "x", "challenge": "c-h-a-l-l-e-n-g-e", "type": "url_verification"}
    ping = json.dumps(make_ping(APP_ID)).encode()
    other_key_body, other_key_headers = sign_interaction(make_ping(APP_ID), KEY)
    stamp = other_key_headers["X-Signature-Timestamp"]
    before = dump_keyspace(sync_redis)
    for headers in ({}, {"X-Slack-Request-Timestamp": str(int(time.time())), "X-Slack-Signature": "v0="}):
        resp = await client.post("/webhooks/slack", data=json.dumps(challenge).encode(), headers=headers)
        assert resp.status == 401 and "c-h-a-l-l-e-n-g-e" not in await resp.text()
    for headers in (
        {},
        {"X-Signature-Ed25519": "00" * 64, "X-Signature-Timestamp": stamp},
        {"X-Signature-Ed25519": other_key_headers["X-Signature-Ed25519"], "X-Signature-Timestamp": str(int(stamp) + 1)},
        {"X-Signature-Ed25519": "zz" * 64, "X-Signature-Timestamp": stamp},
        {"X-Signature-Ed25519": "0" * 7000, "X-Signature-Timestamp": stamp},
    ):
        resp = await client.post("/webhooks/discord", data=ping, headers=headers)
        assert resp.status == 401, headers
        assert '"type": 1' not in await resp.text() and '"type":1' not in await resp.text()
    assert written(before, dump_keyspace(sync_redis)) == {}
    assert (await client.post("/webhooks/discord", data=other_key_body, headers=other_key_headers)).status == 200


@pytest.mark.parametrize("channel", ["telegram", "slack", "discord"])
async def test_a_compressed_request_bomb_is_refused_uninflated_and_writes_nothing(
    client: TestClient, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture, channel: str
) -> None:
    """A ``Content-Encoding: gzip`` bomb is refused and never inflated on the event loop.

    ``switchboard web``'s runner passes a compressed body on as sent (``auto_decompress=False``): it is no JSON the
    platform signed, so it is refused as such (401 for a missing secret or signature) and never grows to 16 MB.
    """
    import gzip

    caplog.set_level(logging.WARNING)
    bomb = gzip.compress(b'{"a":"' + b"A" * (16 * 2**20) + b'"}', compresslevel=9)
    before = dump_keyspace(sync_redis)
    for chunked in (False, True):
        data: Any = bomb
        if chunked:

            async def stream() -> AsyncIterator[bytes]:
                for at in range(0, len(bomb), 4096):
                    yield bomb[at : at + 4096]

            data = stream()
        resp = await client.post(
            f"/webhooks/{channel}", data=data, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )
        assert resp.status == 401, (chunked, resp.status)
    assert written(before, dump_keyspace(sync_redis)) == {}
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
