"""Secrets at egress: substituted only for their domains, refused elsewhere, never in events, logs or responses."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.egress.ca import DeploymentCA
from switchboard.egress.events import RedisEgressSink
from switchboard.egress.placeholders import placeholder
from switchboard.queue.eventlog import read_events
from switchboard.queue.stats import read_stats
from switchboard.types import SessionKey
from switchboard.web.metrics import Metrics
from tests.egress.conftest import PUBLIC, SECRET_VALUE, SHARED_VALUE, Upstream, World, _serve
from tests.egress.test_proxy import _get
from tests.shardindexes import stats_of

TOKEN = placeholder("GITHUB_TOKEN")


async def test_secret_is_substituted_for_its_domain_only(world: World) -> None:
    url = world.url("api.example.test", "/user", tls=True)
    status, _ = await _get(world, url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    assert world.tls.hits[0]["headers"]["Authorization"] == f"Bearer {SECRET_VALUE}"
    (event,) = world.sink.events
    assert event.secrets == ("GITHUB_TOKEN",)


@pytest.mark.parametrize("host", ["api.example.test", "API.example.test."])
async def test_a_placeholder_in_a_plain_http_request_is_refused(world: World, host: str) -> None:
    status, body = await _get(world, world.url(host, "/user"), headers={"Authorization": f"Bearer {TOKEN}"})
    assert (status, b"placeholder_insecure" in body) == (403, True)
    assert world.public.hits == []  # nothing went out, not even without the secret
    assert [(e.decision, e.reason, e.secrets) for e in world.sink.events] == [("refused", "placeholder_insecure", ())]


async def test_secret_is_substituted_inside_https(world: World) -> None:
    status, _ = await _get(world, world.url("api.example.test", "/u", tls=True), headers={"X-Token": TOKEN})
    assert status == 200
    assert world.tls.hits[0]["headers"]["X-Token"] == SECRET_VALUE


@pytest.mark.parametrize(
    ("host", "where", "reason"),
    [
        ("other.example.test", "header", "placeholder_unbound"),  # allowlisted, but the secret is not bound there
        ("api.example.test", "query", "placeholder_outside_headers"),
        ("api.example.test", "body", "placeholder_outside_headers"),
        ("api.example.test", "unknown", "unknown_secret"),
        ("api.example.test", "malformed", "unknown_secret"),
    ],
)
async def test_placeholder_where_it_may_not_go_is_refused(world: World, host: str, where: str, reason: str) -> None:
    headers, path, data = {}, "/p", b""
    if where == "header":
        headers = {"Authorization": f"token {TOKEN}"}
    elif where == "query":
        path = f"/p?key={TOKEN}"
    elif where == "body":
        data = f'{{"token": "{TOKEN}"}}'.encode()
    elif where == "unknown":
        headers = {"Authorization": "{{secret:AWS_KEY}}"}
    else:
        headers = {"Authorization": "{{secret:GITHUB_TOKEN"}
    status, body = await _get(world, world.url(host, path), method="POST", headers=headers, data=data)
    assert status == 403
    assert reason.encode() in body
    assert world.public.hits == []
    assert [(e.decision, e.reason, e.secrets) for e in world.sink.events] == [("refused", reason, ())]


async def test_env_block_secret_follows_its_own_domains(make_world: Callable[..., Any], tmp_path: Path) -> None:
    ca = DeploymentCA.load_or_create(tmp_path / "other-ca")  # an HTTPS "other.example.test", the secret's domain
    cert, key = ca.issue("other.example.test")
    (tmp_path / "other.pem").write_bytes(cert + key)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "other.pem")
    other = Upstream()
    runner, port = await _serve(other.app(), PUBLIC, 0, tls)
    try:
        world = await make_world(
            trust_upstream=False,
            SWITCHBOARD_EGRESS__PORTS=f"80,443,{port}",
            SWITCHBOARD_EGRESS__UPSTREAM_CA_FILE=str(ca.cert_path),
        )
        shared = placeholder("SHARED")
        status, _ = await _get(world, f"https://other.example.test:{port}/", headers={"X-Key": shared})
        assert status == 200
        assert other.hits[0]["headers"]["X-Key"] == SHARED_VALUE
    finally:
        await runner.cleanup()


async def test_env_block_secret_goes_nowhere_else(world: World) -> None:
    shared = placeholder("SHARED")
    status, body = await _get(world, world.url("api.example.test", tls=True), headers={"X-Key": shared})
    assert (status, b"placeholder_unbound" in body) == (403, True)
    status, body = await _get(world, world.url("other.example.test"), headers={"X-Key": shared})
    assert (status, b"placeholder_insecure" in body) == (403, True)  # its own domain, but in clear text
    assert world.public.hits == world.tls.hits == []


async def test_an_agent_cannot_use_another_agents_secret(world: World) -> None:
    grant = world.forwarder.policy.grant("other", "s2")
    world.forwarder.policy.agents["other"] = world.forwarder.policy.agents["other"].__class__(
        allow=("api.example.test",), secrets=world.forwarder.policy.agents["other"].secrets
    )
    status, body = await _get(world, world.url("api.example.test"), token=grant.token, headers={"Authorization": TOKEN})
    assert (status, b"unknown_secret" in body) == (403, True)
    assert world.public.hits == []


async def test_an_echoed_secret_never_reaches_the_client(world: World) -> None:
    url = world.url("api.example.test", "/echo-auth", tls=True)
    status, body = await _get(world, url, headers={"Authorization": TOKEN})
    assert status == 200
    assert world.tls.hits[0]["headers"]["Authorization"] == SECRET_VALUE
    assert world.tls.hits[0]["headers"]["Accept-Encoding"] == "identity"
    assert body == TOKEN.encode()
    assert SECRET_VALUE.encode() not in body


async def test_the_real_value_never_appears_in_events_logs_or_metrics(
    world: World, async_redis: aioredis.Redis, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    world.forwarder.sink = RedisEgressSink(async_redis)
    for host, headers in (
        ("api.example.test", {"Authorization": f"Bearer {TOKEN}"}),
        ("other.example.test", {"Authorization": f"Bearer {TOKEN}"}),
        ("api.example.test", {"Cookie": f"a={TOKEN}"}),
    ):
        await _get(world, world.url(host, "/path?q=1"), headers=headers)
        await _get(world, world.url(host, "/s", tls=True), headers=headers)
    events = await read_events(async_redis, SessionKey(world.grant.session))
    assert [e["kind"] for e in events] == ["egress_request"] * 6
    # plain http never carries the secret (placeholder_insecure), https to the bound host does
    assert [e["decision"] for e in events] == ["refused", "allowed", "refused", "refused", "refused", "allowed"]
    stored = repr(events) + repr(await stats_of(async_redis))
    stats = await read_stats(async_redis)
    assert (stats.egress_allowed, stats.egress_refused) == (2, 4)
    exposition = Metrics().render(stats, None).decode()
    assert "switchboard_egress_allowed_total 2.0" in exposition
    assert "switchboard_egress_refused_total 4.0" in exposition
    out, err = capfd.readouterr()
    for text in (stored, caplog.text, out, err, exposition):
        assert SECRET_VALUE not in text
    assert SECRET_VALUE in world.tls.hits[0]["headers"]["Authorization"]  # it did go where it was bound
