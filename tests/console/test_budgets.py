"""The console's budgets and people routes: spend and alerts per tenant, linking by an operator, scoped and checked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.core.schedules import JobTarget, ScheduleSpec
from switchboard.queue import schedules
from switchboard.queue.budgets import Budgets
from switchboard.queue.people import People
from tests.console.conftest import HASH, OPERATORS_CONFIG, Console

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


VIEWER_CONFIG = f"""
    - name: victor
      password_hash: "{HASH}"
      tenants: [default]
      role: viewer
"""
VIEWER_WRITES: list[tuple[str, dict[str, Any]]] = [
    ("people/link", {"tenant": "default", "principals": ["telegram:42"], "person": "alice"}),
    ("people/unlink", {"tenant": "default", "principal": "telegram:7"}),
    (
        "schedules",
        {
            "id": "nope",
            "target": {"channel": "web", "conversation": "c1"},
            "action": "message",
            "text": "hi",
            "cron": "0 9 * * *",
        },
    ),
    ("schedules/remove", {"id": "kept"}),
    ("schedules/run-now", {"id": "kept"}),
    ("access/approve", {"code": "ABC-234"}),
    ("access/revoke", {"principal": "telegram:7"}),
]


@pytest.mark.parametrize(("path", "body"), VIEWER_WRITES)
async def test_a_viewer_reads_but_every_write_of_these_views_is_refused(
    base_env: dict[str, str],
    tmp_path: Path,
    make_console: Callable[[dict[str, str]], Awaitable[Console]],
    async_redis: aioredis.Redis,
    path: str,
    body: dict[str, Any],
) -> None:
    config = tmp_path / "console.yaml"
    config.write_text(OPERATORS_CONFIG + VIEWER_CONFIG + BUDGETS)
    console = await make_console({**base_env, "SWITCHBOARD_CONFIG": str(config)})
    await People(async_redis).link("default", ["telegram:7"], "bob", by="cli")
    spec = ScheduleSpec(
        id="kept",
        target=JobTarget(channel="web", conversation="c1", agent="assistant"),
        action="message",
        text="hi",
        cron="0 9 * * *",
    )
    await schedules.create_job(async_redis, spec)
    assert (await console.login("victor")).status == 200
    for view in ("budgets", "people", "schedules", "access"):
        assert (await console.client.get(f"/console/api/{view}")).status == 200
    before = {k: await async_redis.type(k) for k in await async_redis.keys("*")}
    resp = await console.write(path, body)
    assert resp.status == 403, await resp.text()
    assert (await resp.json())["error"]["code"] == "viewer"
    assert {k: await async_redis.type(k) for k in await async_redis.keys("*")} == before
    assert await People(async_redis).person_of("default", "telegram:7") == "bob"
    assert [v.spec.id for v in await schedules.list_jobs(async_redis)] == ["kept"]


async def test_each_counter_says_when_its_period_ends(console: Console, async_redis: aioredis.Redis) -> None:
    budgets = Budgets(async_redis, console.settings.file.budgets)
    admitted = await budgets.admit("default", "assistant", "alice", "telegram:42")
    await budgets.charge(admitted.counters, 1)
    assert (await console.login("alice")).status == 200
    body = await (await console.client.get("/console/api/budgets")).json()
    ends = {c.subject.scope: c.period.end for c in admitted.counters}
    assert {b["scope"]: b["resets_at"] for b in body["budgets"]} == ends
