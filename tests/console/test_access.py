"""The console's pairing view through the real app: a stranger refused through Telegram's webhook is listed, paired
by an operator of its tenant only, then revoked; writes need the CSRF token; bad bodies change nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update, sign_update
from switchboard.web.appkeys import ROUTER

from .conftest import OPERATORS_CONFIG, Console

SECRET = "webhook_secret-123"
STRANGER = 6060


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    server = FakeTelegram(token="42:test")
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def console(
    base_env: dict[str, str], tmp_path: Path, fake: FakeTelegram, make_console: Callable[..., Awaitable[Console]]
) -> Console:
    config = yaml.safe_load(OPERATORS_CONFIG)
    config["tenants"] = {"other": {}}
    config["channels"] = {"telegram": {"access": {"mode": "pairing"}}}
    path = tmp_path / "access-console.yaml"
    path.write_text(yaml.safe_dump(config))
    env = base_env | {
        "SWITCHBOARD_CONFIG": str(path),
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:test",
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake.base_url,
    }
    return await make_console(env)


async def _stranger_code(console: Console, fake: FakeTelegram) -> str:
    body, headers = sign_update(make_update("hello?", chat_id=STRANGER, update_id=1), SECRET)
    assert (await console.client.post("/webhooks/telegram", data=body, headers=headers)).status == 200
    gate = console.client.app[ROUTER].gate
    assert gate is not None
    await gate.drain()
    [text] = [str(c.params["text"]) for c in fake.sent(STRANGER)]
    return text.split("pairing code is ")[1][:7]


async def test_an_operator_lists_approves_and_revokes_within_their_tenants(
    console: Console, fake: FakeTelegram, sync_redis: redis.Redis
) -> None:
    code = await _stranger_code(console, fake)
    assert (await console.login("bob")).status == 200
    assert (await console.write("access/approve", {"code": code})).status == 404  # not bob's tenant's code
    refused = await console.write("access/approve", {"code": code, "tenant": "default"})
    assert refused.status == 403
    view = await (await console.client.get("/console/api/access")).json()
    assert view == {"tenants": [{"tenant": "other", "paired": [], "requests": []}]}

    assert (await console.login("alice")).status == 200
    view = await (await console.client.get("/console/api/access")).json()
    [default] = view["tenants"]
    assert [r["principal"] for r in default["requests"]] == [f"telegram:{STRANGER}"]
    assert (await console.write("access/approve", {"code": code}, csrf=False)).status == 403
    approved = await console.write("access/approve", {"code": code, "role": "guest"})
    assert approved.status == 200
    assert (await approved.json())["result"]["principal"] == f"telegram:{STRANGER}"
    view = await (await console.client.get("/console/api/access")).json()
    [default] = view["tenants"]
    assert [(p["principal"], p["role"], p["by"]) for p in default["paired"]] == [
        (f"telegram:{STRANGER}", "guest", "console:alice")
    ]
    assert default["requests"] == []

    revoked = await console.write("access/revoke", {"principal": f"telegram:{STRANGER}"})
    assert revoked.status == 200
    assert (await console.write("access/revoke", {"principal": f"telegram:{STRANGER}"})).status == 404


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("access/approve", {}),
        ("access/approve", {"code": 7}),
        ("access/approve", {"code": "ABC-234", "role": "root"}),
        ("access/approve", {"code": "ABC-234", "tenant": ""}),
        ("access/revoke", {"principal": "nobody"}),
        ("access/revoke", ["telegram:1"]),
    ],
)
async def test_bad_bodies_are_refused_and_change_nothing(
    console: Console, sync_redis: redis.Redis, path: str, body: Any
) -> None:
    assert (await console.login("alice")).status == 200
    before = sorted(sync_redis.keys("*"))
    resp = await console.write(path, body)
    assert resp.status == 400
    assert sorted(sync_redis.keys("*")) == before
