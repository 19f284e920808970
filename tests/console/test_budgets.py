"""The console's budgets and people routes: spend and alerts per tenant, linking by an operator, scoped and checked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.queue.budgets import Budgets
from switchboard.queue.people import People
from tests.console.conftest import OPERATORS_CONFIG, Console

BUDGETS = """
budgets:
  - {scope: tenant, period: day, credits: 10, alert_at: [0.5]}
  - {scope: user, period: month, credits: 4}
"""


@pytest.fixture
async def console(
    base_env: dict[str, str], tmp_path: Path, make_console: Callable[[dict[str, str]], Awaitable[Console]]
) -> Console:
    config = tmp_path / "console.yaml"
    config.write_text(OPERATORS_CONFIG + BUDGETS)
    return await make_console({**base_env, "SWITCHBOARD_CONFIG": str(config)})


async def test_an_operator_reads_the_spend_and_alerts_of_their_tenants_only(
    console: Console, async_redis: aioredis.Redis
) -> None:
    budgets = Budgets(async_redis, console.settings.file.budgets)
    for tenant in ("default", "other"):
        admitted = await budgets.admit(tenant, "assistant", "alice", "telegram:42")
        await budgets.charge(admitted.counters, 6)
    assert (await console.login("alice")).status == 200
    resp = await console.client.get("/console/api/budgets")
    assert resp.status == 200
    body = await resp.json()
    assert [(b["tenant"], b["scope"], b["subject"], b["spent"], b["credits"]) for b in body["budgets"]] == [
        ("default", "tenant", "default", 6, 10),
        ("default", "user", "alice", 6, 4),
    ]
    alerts = sorted((a["tenant"], a["scope"], a["threshold"], a["spent"]) for a in body["alerts"])
    assert alerts == [("default", "tenant", 0.5, 6), ("default", "user", 0.8, 6), ("default", "user", 1.0, 6)]


async def test_an_operator_links_and_unlinks_a_person(console: Console, async_redis: aioredis.Redis) -> None:
    assert (await console.login("alice")).status == 200
    resp = await console.write(
        "people/link", {"tenant": "default", "principals": ["telegram:42", "slack:U123"], "person": "alice"}
    )
    assert resp.status == 200, await resp.text()
    result = (await resp.json())["result"]
    assert result["kind"] == "person_linked" and result["by"] == "operator:console:alice"
    assert await People(async_redis).person_of("default", "slack:U123") == "alice"
    people = await (await console.client.get("/console/api/people")).json()
    assert people == {"people": [{"tenant": "default", "person": "alice", "principals": ["slack:U123", "telegram:42"]}]}
    taken = await console.write("people/link", {"tenant": "default", "principals": ["telegram:42"], "person": "bob"})
    assert taken.status == 400 and "already linked to alice" in await taken.text()
    resp = await console.write("people/unlink", {"tenant": "default", "principal": "telegram:42"})
    assert resp.status == 200 and (await resp.json())["result"]["person"] == "alice"
    again = await console.write("people/unlink", {"tenant": "default", "principal": "telegram:42"})
    assert again.status == 404
    log = await People(async_redis).log("default")
    assert [e.kind for e in log] == ["person_unlinked", "person_linked"]


BAD: list[tuple[str, Any, int]] = [
    ("people/link", {"tenant": "default", "principals": ["telegram:42"], "person": "Not A Person"}, 400),
    ("people/link", {"tenant": "default", "principals": ["no-channel"], "person": "alice"}, 400),
    ("people/link", {"tenant": "default", "principals": ["console:alice"], "person": "alice"}, 400),
    ("people/link", {"tenant": "default", "principals": [], "person": "alice"}, 400),
    ("people/link", {"tenant": "default", "principals": "telegram:42", "person": "alice"}, 400),
    ("people/link", {"principals": ["telegram:42"], "person": "alice"}, 400),
    ("people/link", ["not", "an", "object"], 400),
    ("people/link", {"tenant": "other", "principals": ["telegram:42"], "person": "alice"}, 403),
    ("people/unlink", {"tenant": "other", "principal": "telegram:42"}, 403),
    ("people/unlink", {"tenant": "default"}, 400),
]


@pytest.mark.parametrize(("path", "body", "status"), BAD)
async def test_a_bad_or_foreign_link_request_changes_nothing(
    console: Console, async_redis: aioredis.Redis, path: str, body: Any, status: int
) -> None:
    assert (await console.login("alice")).status == 200
    before = sorted(await async_redis.keys("sb:{people:*"))
    resp = await console.write(path, body)
    assert resp.status == status, await resp.text()
    assert sorted(await async_redis.keys("sb:{people:*")) == before


async def test_a_link_without_the_csrf_header_or_sign_in_is_refused(
    console: Console, async_redis: aioredis.Redis
) -> None:
    body = {"tenant": "default", "principals": ["telegram:42"], "person": "alice"}
    assert (await console.write("people/link", body)).status == 401
    assert (await console.login("alice")).status == 200
    assert (await console.write("people/link", body, csrf=False)).status == 403
    assert await async_redis.keys("sb:{people:*") == []
