"""The interactions endpoint through the real app: signed for real, queued once, mutations refused with 401."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient
from nacl.signing import SigningKey

from switchboard.channels.discord.adapter import DiscordChannel
from switchboard.channels.discord.fake.platform import (
    FakeDiscord,
    make_command,
    make_component,
    make_ping,
    sign_interaction,
)
from switchboard.core.actions import Choice, OfferChoice
from switchboard.core.messages import ChoiceSelected, CommandIssued, ConversationRef, InboundMessage
from switchboard.errors import SignatureError
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.channels._discord_fixtures import (
    APP_ID,
    KEY,
    PUBLIC_KEY,
    TOKEN,
    Sending,
    channel,
    fake,
    request,
    settings,
    signed,
)

__all__ = ["channel", "fake"]  # fixtures, imported for pytest

SIGNATURE, TIMESTAMP = "X-Signature-Ed25519", "X-Signature-Timestamp"


@pytest.fixture
async def client(base_env: dict[str, str], fake: FakeDiscord, aiohttp_client: Any) -> TestClient:
    env = base_env | {
        "SWITCHBOARD_DISCORD__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_DISCORD__PUBLIC_KEY": PUBLIC_KEY,
        "SWITCHBOARD_DISCORD__APPLICATION_ID": APP_ID,
        "SWITCHBOARD_DISCORD__API_BASE_URL": fake.api_url,
        "SWITCHBOARD_DISCORD__GATEWAY": "false",
    }
    return await aiohttp_client(create_app(load_settings(env), listeners=False))  # type: ignore[no-any-return]


def _queued(sync_redis: redis.Redis) -> list[InboundMessage]:
    found: list[InboundMessage] = []
    for key in sync_redis.keys("sb:*:messages"):
        found += [InboundMessage.model_validate_json(v) for v in sync_redis.hvals(key)]
    return found


async def test_ping_is_answered_pong_after_verification(client: TestClient, sync_redis: redis.Redis) -> None:
    body, headers = sign_interaction(make_ping(APP_ID), KEY)
    resp = await client.post("/webhooks/discord", data=body, headers=headers)
    assert resp.status == 200 and await resp.json() == {"type": 1}
    assert resp.headers["Content-Type"] == "application/json"
    unsigned = await client.post("/webhooks/discord", data=body, headers={"Content-Type": "application/json"})
    assert unsigned.status == 401
    assert sync_redis.keys("sb:*:inbox") == []


async def test_ask_is_deferred_and_a_replay_is_queued_once(client: TestClient, sync_redis: redis.Redis) -> None:
    body, headers = sign_interaction(make_command("ask", "status?", application_id=APP_ID), KEY)
    for _ in range(3):
        resp = await client.post("/webhooks/discord", data=body, headers=headers)
        assert resp.status == 200 and await resp.json() == {"type": 5}
    [queued] = _queued(sync_redis)
    assert isinstance(queued.event, CommandIssued) and queued.event.name == "ask" and queued.text == "status?"
    assert sum(sync_redis.llen(k) for k in sync_redis.keys("sb:*:inbox")) == 1


async def test_choice_round_trip(
    client: TestClient, channel: DiscordChannel, fake: FakeDiscord, sync_redis: redis.Redis
) -> None:
    offer = OfferChoice(
        question="Deploy?", options=[Choice(id="deploy:yes", label="Yes"), Choice(id="deploy:no", label="No")]
    )
    conversation = ConversationRef(channel="discord", conversation="300", extra={"channel_id": "300"})
    receipt = await channel.perform(offer, conversation, Sending())
    shown = fake.state.messages[receipt.platform_ids[0]]
    click = make_component("deploy:no", message=shown, application_id=APP_ID)
    body, headers = sign_interaction(click, KEY)
    resp = await client.post("/webhooks/discord", data=body, headers=headers)
    assert resp.status == 200 and await resp.json() == {"type": 6}
    [queued] = _queued(sync_redis)
    assert isinstance(queued.event, ChoiceSelected)
    assert queued.event.option_id == "deploy:no" and queued.text == "No"
    assert queued.event.offer_message_id == shown["id"]


def _mutations(rng: random.Random, count: int) -> list[tuple[str, bytes, dict[str, str]]]:
    other = SigningKey.generate()
    cases: list[tuple[str, bytes, dict[str, str]]] = []
    kinds = ["body_bit", "signature_bit", "timestamp_bit", "other_key", "missing", "other_timestamp", "stale", "cut"]
    for index in range(count):
        kind = kinds[index % len(kinds)]
        payload = rng.choice([make_ping(APP_ID), make_command("ask", f"hi {index}", application_id=APP_ID)])
        body, headers = sign_interaction(payload, KEY)
        match kind:
            case "body_bit":
                at = rng.randrange(len(body))
                body = body[:at] + bytes([body[at] ^ (1 << rng.randrange(8))]) + body[at + 1 :]
            case "signature_bit":
                raw = bytearray(bytes.fromhex(headers[SIGNATURE]))
                raw[rng.randrange(64)] ^= 1 << rng.randrange(8)
                headers[SIGNATURE] = raw.hex()
            case "timestamp_bit":
                stamp = bytearray(headers[TIMESTAMP].encode())
                at = rng.randrange(len(stamp))
                stamp[at] ^= 1 << rng.randrange(4)  # stays printable (0x30-0x3f): headers cannot carry controls
                headers[TIMESTAMP] = stamp.decode("latin-1")
            case "other_key":
                body, headers = sign_interaction(payload, other)
            case "missing":
                for name in rng.choice([[SIGNATURE], [TIMESTAMP], [SIGNATURE, TIMESTAMP]]):
                    del headers[name]
            case "other_timestamp":
                _, signed_other = sign_interaction(body, KEY, timestamp=str(int(time.time()) - rng.randrange(1, 90)))
                headers[SIGNATURE] = signed_other[SIGNATURE]
            case "stale":
                body, headers = sign_interaction(
                    body, KEY, timestamp=str(int(time.time()) - 16 * 60 - rng.randrange(999))
                )
            case "cut":
                body = body[: rng.randrange(len(body))]
        cases.append((kind, body, headers))
    return cases


async def test_thousands_of_mutated_requests_are_401_and_change_nothing(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    before = sorted(sync_redis.keys("*"))
    statuses: dict[int, int] = {}
    for kind, body, headers in _mutations(random.Random(8), 2400):
        resp = await client.post("/webhooks/discord", data=body, headers=headers)
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        if resp.status != 401:
            pytest.fail(f"{kind} mutation answered {resp.status}: {await resp.text()}")
        assert (await resp.json())["error"]["code"] == "bad_signature"
    assert statuses == {401: 2400}
    assert sorted(sync_redis.keys("*")) == before
    assert _queued(sync_redis) == []


async def test_signed_but_malformed_is_400_and_changes_nothing(client: TestClient, sync_redis: redis.Redis) -> None:
    before = sorted(sync_redis.keys("*"))
    for body in [b"{not json", b"[]", json.dumps({"id": "1", "application_id": "2", "type": 2}).encode(), b"\xff"]:
        signed_body, headers = sign_interaction(body, KEY)
        resp = await client.post("/webhooks/discord", data=signed_body, headers=headers)
        assert resp.status == 400, await resp.text()
    assert sorted(sync_redis.keys("*")) == before


# the adapter alone ------------------------------------------------------------------------------------------------


async def test_signed_ping_verifies_and_pongs(channel: DiscordChannel) -> None:
    raw = signed(make_ping())
    await channel.verify(raw)
    assert (await channel.receive(raw)).answer.body == b'{"type":1}'


@pytest.mark.parametrize(
    "mutate",
    [
        "no_signature",
        "no_timestamp",
        "other_key",
        "flipped_body",
        "flipped_signature",
        "other_timestamp",
        "stale",
        "not_hex",
        "short_signature",
        "repeated_header",
    ],
)
async def test_bad_signatures_are_401(channel: DiscordChannel, mutate: str) -> None:
    payload = json.dumps(make_command("ask", "hi")).encode()
    raw = signed(payload)
    headers = dict(raw.headers)
    body = raw.body
    match mutate:
        case "no_signature":
            del headers["X-Signature-Ed25519"]
        case "no_timestamp":
            del headers["X-Signature-Timestamp"]
        case "other_key":
            headers = dict(signed(payload, SigningKey.generate()).headers)
        case "flipped_body":
            body = body[:10] + bytes([body[10] ^ 1]) + body[11:]
        case "flipped_signature":
            sig = headers["X-Signature-Ed25519"]
            headers["X-Signature-Ed25519"] = ("1" if sig[0] == "0" else "0") + sig[1:]
        case "other_timestamp":
            headers["X-Signature-Timestamp"] = str(int(headers["X-Signature-Timestamp"]) - 1)
        case "stale":
            headers = dict(signed(payload, timestamp=str(int(time.time()) - 16 * 60)).headers)
        case "not_hex":
            headers["X-Signature-Ed25519"] = "zz" * 64
        case "short_signature":
            headers["X-Signature-Ed25519"] = headers["X-Signature-Ed25519"][:-2]
        case "repeated_header":
            from multidict import CIMultiDict, CIMultiDictProxy

            multi = CIMultiDict(headers)
            multi.add("X-Signature-Ed25519", headers["X-Signature-Ed25519"])
            raw = request(body)
            raw = type(raw)(raw.method, raw.path, CIMultiDictProxy(multi), {}, body)
            with pytest.raises(SignatureError) as caught:
                await channel.verify(raw)
            assert caught.value.status == 401
            return
    with pytest.raises(SignatureError) as caught:
        await channel.verify(request(body, headers))
    assert caught.value.status == 401


async def test_without_a_public_key_every_interaction_is_401() -> None:
    adapter = DiscordChannel(settings(public_key=None))
    with pytest.raises(SignatureError) as caught:
        await adapter.verify(signed(make_ping()))
    assert caught.value.status == 401
    await adapter.aclose()
