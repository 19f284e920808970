"""Forged and misdirected Teams activities through the real route: every bad token is 401/403, never a 5xx, nothing
is queued, and the bot never posts to the service URL an attacker names.

Tokens are minted with the fake Bot Framework's RSA key (served by its OpenID metadata) and then mutated one way
each: the audience, the issuer, the lifetime, the key id, the algorithm (``none``; HS256 keyed with the public key,
the classic confusion attack), the signature, the endorsement, the ``serviceurl`` claim, the header itself.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import jwt
import pytest
import redis
from aiohttp.test_utils import TestClient

from switchboard.channels.teams.fake.platform import FakeTeams, SigningKey
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.channels.teams_support import APP_ID, PASSWORD, payload, teams_env

NOW = int(time.time())


@pytest.fixture
async def fake() -> AsyncIterator[FakeTeams]:
    async with FakeTeams(app_id=APP_ID, app_password=PASSWORD) as server:
        yield server


@pytest.fixture
async def attacker() -> AsyncIterator[FakeTeams]:
    """A Connector look-alike the attacker controls: nothing may ever reach it."""
    async with FakeTeams() as server:
        yield server


@pytest.fixture
async def gateway(base_env: dict[str, str], fake: FakeTeams, aiohttp_client: Any) -> TestClient:
    settings = load_settings(base_env | teams_env(fake))
    return await aiohttp_client(create_app(settings, listeners=False))  # type: ignore[no-any-return]


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _tamper(token: str) -> str:
    head, body, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["aud"] = APP_ID + "-other"
    return f"{head}.{_b64(claims)}.{signature}"


Forge = Callable[[FakeTeams, str], str]
"""(the genuine fake, the service URL the token names) → a bad token."""

MUTATIONS: dict[str, Forge] = {
    "wrong audience": lambda f, url: f.key.mint("another-bot", url),
    "wrong issuer": lambda f, url: f.key.mint(APP_ID, url, iss="https://sts.windows.net/evil/"),
    "expired": lambda f, url: f.key.mint(APP_ID, url, exp=NOW - 3600, nbf=NOW - 7200),
    "not yet valid": lambda f, url: f.key.mint(APP_ID, url, nbf=NOW + 3600, exp=NOW + 7200),
    "no expiry": lambda f, url: f.key.mint(APP_ID, url, exp=None),
    "unknown kid": lambda f, url: SigningKey("not-published").mint(APP_ID, url),
    "published kid, other key": lambda f, url: SigningKey(f.key.kid).mint(APP_ID, url),
    "alg none": lambda f, url: (
        f"{_b64({'alg': 'none', 'kid': f.key.kid})}."
        f"{_b64({'iss': 'https://api.botframework.com', 'aud': APP_ID, 'serviceurl': url, 'exp': NOW + 600})}."
    ),
    "HS256 with the public key": lambda f, url: _hs256(f, url),
    "bad signature": lambda f, url: _tamper(f.key.mint(APP_ID, url)),
    "no serviceurl claim": lambda f, url: f.key.mint(APP_ID, url, serviceurl=None),
    "not a JWT": lambda f, url: "definitely.not.a-jwt",
}


def _hs256(fake: FakeTeams, url: str) -> str:
    claims = {"iss": "https://api.botframework.com", "aud": APP_ID, "serviceurl": url, "exp": NOW + 600}
    header = {"alg": "HS256", "kid": fake.key.kid, "typ": "JWT"}
    signing_input = f"{_b64(header)}.{_b64(claims)}".encode()
    import hashlib
    import hmac

    mac = hmac.new(fake.key.public_pem, signing_input, hashlib.sha256).digest()
    return signing_input.decode() + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


async def _refused(gateway: TestClient, body: bytes, headers: dict[str, str]) -> int:
    resp = await gateway.post("/webhooks/teams", data=body, headers=headers)
    await resp.read()
    return resp.status


@pytest.mark.parametrize("mutation", list(MUTATIONS), ids=list(MUTATIONS))
async def test_a_mutated_token_is_refused_and_changes_nothing(
    gateway: TestClient, fake: FakeTeams, attacker: FakeTeams, sync_redis: redis.Redis, mutation: str
) -> None:
    activity = payload("personal.json", fake.service_url)
    body = json.dumps(activity).encode()
    before = sorted(sync_redis.keys("*"))
    token = MUTATIONS[mutation](fake, fake.service_url)
    status = await _refused(gateway, body, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert status in (401, 403)
    assert sorted(sync_redis.keys("*")) == before
    assert fake.calls == [] and attacker.calls == []


async def test_a_genuine_token_for_another_service_url_cannot_redirect_replies(
    gateway: TestClient, fake: FakeTeams, attacker: FakeTeams, sync_redis: redis.Redis
) -> None:
    """A captured token (serviceurl = Microsoft's) replayed on an activity naming the attacker's host."""
    activity = payload("personal.json", attacker.service_url)
    body = json.dumps(activity).encode()
    before = sorted(sync_redis.keys("*"))
    for claimed in (fake.service_url, fake.service_url.rstrip("/"), fake.base_url):
        headers = fake.key.authorization(APP_ID, claimed)
        assert await _refused(gateway, body, headers) == 401
    # and a token naming the attacker's URL on an activity naming Microsoft's
    genuine = json.dumps(payload("personal.json", fake.service_url)).encode()
    assert await _refused(gateway, genuine, fake.key.authorization(APP_ID, attacker.service_url)) == 401
    assert sorted(sync_redis.keys("*")) == before
    assert attacker.calls == [] and attacker.token_requests == 0


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ""},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer " + "a" * 8000},
    ],
    ids=["missing", "empty", "basic", "bearer without token", "huge"],
)
async def test_a_missing_or_malformed_header_is_refused(
    gateway: TestClient, fake: FakeTeams, sync_redis: redis.Redis, headers: dict[str, str]
) -> None:
    body = json.dumps(payload("personal.json", fake.service_url)).encode()
    before = sorted(sync_redis.keys("*"))
    assert await _refused(gateway, body, headers) == 401
    assert sorted(sync_redis.keys("*")) == before


async def test_a_key_not_endorsed_for_the_channel_is_refused(
    gateway: TestClient, fake: FakeTeams, sync_redis: redis.Redis
) -> None:
    activity = payload("personal.json", fake.service_url) | {"channelId": "webchat"}
    body = json.dumps(activity).encode()
    before = sorted(sync_redis.keys("*"))
    assert await _refused(gateway, body, fake.key.authorization(APP_ID, fake.service_url)) == 401
    assert sorted(sync_redis.keys("*")) == before


async def test_an_authentic_token_on_a_body_that_is_not_an_activity_is_400(
    gateway: TestClient, fake: FakeTeams, sync_redis: redis.Redis
) -> None:
    before = sorted(sync_redis.keys("*"))
    for body in (b"not json", b"[]", json.dumps({"serviceUrl": fake.service_url, "channelId": "msteams"}).encode()):
        assert await _refused(gateway, body, fake.key.authorization(APP_ID, fake.service_url)) in (400, 401)
    assert sorted(sync_redis.keys("*")) == before


async def test_unreachable_signing_keys_are_a_503_the_connector_retries(
    base_env: dict[str, str], fake: FakeTeams, aiohttp_client: Any, sync_redis: redis.Redis
) -> None:
    env = base_env | teams_env(fake) | {"SWITCHBOARD_TEAMS__OPENID_METADATA_URL": "http://127.0.0.1:9/metadata"}
    gateway = await aiohttp_client(create_app(load_settings(env), listeners=False))
    body = json.dumps(payload("personal.json", fake.service_url)).encode()
    before = sorted(sync_redis.keys("*"))
    assert await _refused(gateway, body, fake.key.authorization(APP_ID, fake.service_url)) == 503
    assert sorted(sync_redis.keys("*")) == before


def test_the_forgeries_are_what_they_claim() -> None:
    """The HS256 forgery really is keyed with the published public key (PyJWT itself would accept it as HS256)."""
    key = SigningKey("k")
    forged = _hs256(type("F", (), {"key": key})(), "https://x/")  # type: ignore[arg-type]
    claims = jwt.decode(
        forged, key.public_pem, algorithms=["HS256"], audience=APP_ID, options={"verify_signature": False}
    )
    assert claims["aud"] == APP_ID and jwt.get_unverified_header(forged)["alg"] == "HS256"
