"""The console's schedule routes on the real app: create, list, run now and remove within the operator's tenants;
bad input refused with nothing stored; a job that could not be delivered says why."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from .conftest import Console

JOB: dict[str, Any] = {
    "id": "renewal",
    "target": {"channel": "whatsapp", "conversation": "4915550001"},
    "action": "message",
    "text": "Your plan renews tomorrow.",
    "cron": "0 9 * * *",
    "timezone": "Europe/Berlin",
}


async def test_create_list_run_now_and_remove(console: Console) -> None:
    await console.login()
    created = await console.write("schedules", JOB)
    assert created.status == 201, await created.text()
    job = (await created.json())["result"]
    assert job["created_by"] == "console:alice" and job["target"]["agent"] == "assistant"
    assert job["session"] == "default/assistant/whatsapp/default/4915550001"

    listed = await (await console.client.get("/console/api/schedules")).json()
    assert [j["id"] for j in listed["schedules"]] == ["renewal"]

    # The user never wrote on WhatsApp and the job has no template: not delivered, and the reason is visible.
    ran = await console.write("schedules/run-now", {"id": "renewal"})
    result = (await ran.json())["result"]
    assert ran.status == 200 and result["outcome"] == "skipped"
    assert result["job"]["last_reason"].startswith("window_closed: outside WhatsApp's 24-hour window")
    listed = await (await console.client.get("/console/api/schedules?session=" + job["session"])).json()
    assert listed["schedules"][0]["skipped"] == 1 and "template" in listed["schedules"][0]["last_reason"]

    assert (await console.write("schedules", JOB)).status == 409  # the id is taken
    removed = await console.write("schedules/remove", {"id": "renewal"})
    assert removed.status == 200 and (await removed.json())["result"] == {"removed": True}
    assert (await console.write("schedules/remove", {"id": "renewal"})).status == 404


async def test_another_tenants_jobs_are_out_of_reach(console: Console) -> None:
    await console.login("bob")  # tenant "other"
    assert (await console.write("schedules", JOB)).status == 403  # the file's tenant is "default", not bob's
    assert (await console.write("schedules", {**JOB, "tenant": "other"})).status == 201
    await console.client.post("/console/api/logout", headers={"X-CSRF-Token": console.csrf})
    await console.login("alice")
    assert (await (await console.client.get("/console/api/schedules")).json())["schedules"] == []
    assert (await console.write("schedules/run-now", {"id": "renewal"})).status == 404
    assert (await console.write("schedules/remove", {"id": "renewal"})).status == 404


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({**JOB, "cron": "every day"}, 400, "cron"),
        ({**JOB, "timezone": "Europe/Atlantis"}, 400, "unknown time zone"),
        ({**JOB, "action": "shout"}, 400, "action"),
        ({**JOB, "extra": 1}, 400, "extra"),
        ({k: v for k, v in JOB.items() if k != "cron"}, 400, "exactly one of 'at'"),
        ({**JOB, "cron": None, "at": "2001-01-01T00:00:00Z"}, 400, "in the past"),
        ([1, 2], 400, "JSON object"),
    ],
)
async def test_bad_jobs_are_refused_and_nothing_is_stored(
    console: Console, sync_redis: redis.Redis, body: Any, status: int, message: str
) -> None:
    await console.login()
    answer = await console.write("schedules", body)
    assert answer.status == status and message in (await answer.json())["error"]["message"]
    assert sync_redis.keys("sb:{schedules}*") == []


async def test_writes_need_the_csrf_token_and_a_signed_in_operator(console: Console) -> None:
    assert (await console.client.get("/console/api/schedules")).status == 401
    await console.login()
    assert (await console.write("schedules", JOB, csrf=False)).status == 403
