"""Scheduled jobs: claimed once per occurrence by racing schedulers, misfire policies, cron in time zones, the
24-hour windows, and bad input refused with nothing written."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from switchboard.core.messages import InboundMessage, Scheduled
from switchboard.core.schedules import ScheduleSpec, next_after, occurrence_key
from switchboard.errors import ConfigError
from switchboard.queue.connection import async_client
from switchboard.queue.eventlog import decode_entries
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.schedules import (
    JobExistsError,
    JobLimitError,
    Scheduler,
    create_job,
    get_job,
    job_session,
    list_jobs,
    remove_job,
    run_now,
    sync_config_jobs,
)
from switchboard.settings import QueueSettings, load_file
from switchboard.types import SessionKey
from tests.queue.conftest import make_message

G = GlobalKeys()


def spec(
    job_id: str,
    *,
    channel: str = "telegram",
    conversation: str = "c1",
    at: float | None = None,
    cron: str | None = None,
    **fields: Any,
) -> ScheduleSpec:
    when: dict[str, Any] = {"cron": cron} if cron else {"at": dt.datetime.fromtimestamp(at or time.time(), dt.UTC)}
    return ScheduleSpec.model_validate(
        {
            "id": job_id,
            "target": {"channel": channel, "conversation": conversation, "agent": "assistant"},
            "action": fields.pop("action", "message"),
            "text": fields.pop("text", f"reminder {job_id}"),
            **when,
            **fields,
        }
    )


async def inbox(client: aioredis.Redis, session: SessionKey) -> list[InboundMessage]:
    keys = SessionKeys(session)
    ids = [i.decode() for i in await client.lrange(keys.inbox, 0, -1)]
    return [InboundMessage.model_validate_json(await client.hget(keys.messages, i)) for i in ids]


async def events(client: aioredis.Redis, session: SessionKey) -> list[dict[str, Any]]:
    return decode_entries(await client.xrange(SessionKeys(session).events))


async def set_due(client: aioredis.Redis, job_id: str, at: float) -> None:
    """Make the job's next occurrence ``at`` (as if the gateway had been down since)."""
    await client.zadd(G.schedules_due, {job_id: round(at * 1000)})


async def test_a_due_job_is_delivered_into_its_session_once_with_its_occurrence_as_dedup_key(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    job = spec("remind-1", at=time.time() - 1)
    await create_job(client, job)
    scheduler = Scheduler(client, queue_settings)

    assert await scheduler.tick() == 1
    assert await scheduler.tick() == 0  # one-off: nothing left due

    [message] = await inbox(client, job_session(job))
    assert isinstance(message.event, Scheduled)
    assert message.event.job_id == "remind-1" and message.event.action == "message"
    assert message.text == "reminder remind-1" and message.sender.id == "schedule:remind-1"
    assert message.dedup_key == occurrence_key("remind-1", message.event.due_at)
    view = await get_job(client, "remind-1")
    assert view is not None and view.fired == 1 and view.next_at is None and view.last_outcome == "delivered"
    assert await client.zcard(G.schedules_inflight) == 0


async def test_two_schedulers_racing_claim_every_occurrence_exactly_once(
    redis_url: str, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    jobs = [spec(f"race-{i}", conversation=f"c{i % 50}", at=time.time() - 1) for i in range(400)]
    for job in jobs:
        await create_job(client, job)
    other = async_client(redis_url)
    try:
        first, second = Scheduler(client, queue_settings), Scheduler(other, queue_settings)
        handled = await asyncio.gather(first.tick(), second.tick(), first.tick(), second.tick())
    finally:
        await other.aclose()

    assert sum(handled) == 400
    delivered: list[str] = []
    for conversation in range(50):
        for message in await inbox(client, job_session(spec("x", conversation=f"c{conversation}"))):
            assert isinstance(message.event, Scheduled)
            delivered.append(message.event.job_id)
    assert sorted(delivered) == sorted(job.id for job in jobs)  # each once: no job twice, none lost
    views = await list_jobs(client, tenant="default")
    assert {v.fired for v in views} == {1}


async def test_an_occurrence_claimed_by_a_scheduler_that_died_is_fired_again_and_deduplicated(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    job = spec("crashy", at=time.time() - 1)
    await create_job(client, job)
    due_ms = round(job.first_at(time.time()) * 1000)  # type: ignore[operator]
    # A scheduler claimed it and died before delivering: in flight, its deadline passed.
    claimed = await client.evalsha(
        (await client.script_load(_claim_source())), 3, G.schedules_due, G.schedules_inflight, G.schedule("crashy"),
        "crashy", due_ms, "", int(time.time() * 1000) - 1, "1", int(time.time() * 1000),
    )  # fmt: skip
    assert claimed == 1
    # ...and another had delivered the same occurrence before its record was written (a double fire).
    await Ingestor(client, queue_settings).ingest(
        make_message("reminder crashy", dedup=occurrence_key("crashy", due_ms / 1000))
    )

    assert await Scheduler(client, queue_settings).tick() == 1
    view = await get_job(client, "crashy")
    assert view is not None and view.last_outcome == "duplicate"  # the fire again found it delivered
    assert len(await inbox(client, job_session(job))) == 1
    assert await client.zcard(G.schedules_inflight) == 0


def _claim_source() -> str:
    from switchboard.queue import scripts

    return scripts.SCHEDULE_CLAIM.source


@pytest.mark.parametrize(
    ("misfire", "late_s", "grace_s", "delivered"),
    [
        ("run_once", 3600, 300, True),  # past its grace: run once anyway
        ("skip", 3600, 300, False),  # past its grace: skipped, and said why
        ("skip", 60, 300, True),  # within its grace: on time
    ],
)
async def test_a_missed_occurrence_is_run_once_or_skipped_by_its_misfire_policy(
    client: aioredis.Redis, queue_settings: QueueSettings, misfire: str, late_s: int, grace_s: int, delivered: bool
) -> None:
    job = spec("daily", cron="0 9 * * *", timezone="Europe/Paris", misfire=misfire, grace_s=grace_s)
    await create_job(client, job)
    missed = time.time() - late_s
    await set_due(client, "daily", missed)  # and several more occurrences before it were missed too (one day's)
    await Scheduler(client, queue_settings).tick()

    messages = await inbox(client, job_session(job))
    assert len(messages) == (1 if delivered else 0)
    view = await get_job(client, "daily")
    assert view is not None and view.next_at is not None and view.next_at > time.time()  # never a burst of catch-ups
    if not delivered:
        assert view.last_outcome == "skipped" and view.last_reason.startswith("misfire")
        [fact] = [e for e in await events(client, job_session(job)) if e["kind"] == "schedule_skipped"]
        assert fact["reason"] == "misfire" and fact["job_id"] == "daily"


@pytest.mark.parametrize(
    ("cron", "zone", "after", "expected"),
    [
        # 09:00 in Paris is 08:00 UTC in winter...
        ("0 9 * * *", "Europe/Paris", "2026-01-15T10:00:00+00:00", "2026-01-16T08:00:00+00:00"),
        # ...and 07:00 UTC in summer
        ("0 9 * * *", "Europe/Paris", "2026-07-15T10:00:00+00:00", "2026-07-16T07:00:00+00:00"),
        # 02:30 does not exist on the spring-forward night: the next valid local time
        ("30 2 * * *", "Europe/Paris", "2026-03-28T12:00:00+00:00", "2026-03-29T01:00:00+00:00"),
        # weekdays only: Friday evening → Monday morning in New York
        ("0 9 * * mon-fri", "America/New_York", "2026-12-04T23:00:00+00:00", "2026-12-07T14:00:00+00:00"),
        ("*/15 * * * *", "UTC", "2026-05-01T10:07:00+00:00", "2026-05-01T10:15:00+00:00"),
    ],
)
def test_cron_occurrences_follow_the_jobs_time_zone(cron: str, zone: str, after: str, expected: str) -> None:
    job = spec("tz", cron=cron, timezone=zone)
    got = next_after(job, dt.datetime.fromisoformat(after).timestamp())
    assert got == dt.datetime.fromisoformat(expected).timestamp()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cron": "61 * * * *"}, "not a five-field cron expression"),
        ({"cron": "* * * * * *"}, "not a five-field cron expression"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({}, "exactly one of 'at'"),
        ({"cron": "0 9 * * *", "at": "2030-01-01T00:00:00Z"}, "exactly one of 'at'"),
        ({"cron": "0 9 * * *", "misfire": "sometimes"}, "misfire"),
        ({"cron": "0 9 * * *", "template": {"name": "Bad Name", "language": "en"}}, "template.name"),
        ({"cron": "0 9 * * *", "surprise": 1}, "surprise"),
    ],
)
def test_bad_jobs_are_refused_with_a_reason(fields: dict[str, Any], message: str) -> None:
    body = {"id": "bad", "target": {"channel": "telegram", "conversation": "c1"}, "action": "turn", "text": "hi"}
    with pytest.raises(ValidationError) as caught:
        ScheduleSpec.model_validate(body | fields)
    assert message in str(caught.value)


async def test_store_refuses_a_taken_id_a_past_time_and_a_full_session_writing_nothing(
    client: aioredis.Redis,
) -> None:
    await create_job(client, spec("one", cron="0 9 * * *"))
    before = await get_job(client, "one")
    with pytest.raises(JobExistsError):
        await create_job(client, spec("one", cron="0 10 * * *"))
    assert await get_job(client, "one") == before
    with pytest.raises(ValueError, match="in the past"):
        await create_job(client, spec("late", at=time.time() - 86_400))
    assert await get_job(client, "late") is None
    await create_job(client, spec("two", cron="0 9 * * *"), per_session=2)
    with pytest.raises(JobLimitError):
        await create_job(client, spec("three", cron="0 9 * * *"), per_session=2)
    assert await get_job(client, "three") is None
    assert await remove_job(client, "one") and not await remove_job(client, "one")
    assert await client.zscore(G.schedules_due, "one") is None


async def test_config_jobs_keep_their_next_occurrence_across_restarts_and_leave_with_the_file(
    client: aioredis.Redis,
) -> None:
    yaml_job = ScheduleSpec.model_validate(
        {"id": "cfg", "target": {"channel": "telegram", "conversation": "c1"}, "action": "turn", "text": "digest",
         "cron": "0 9 * * *"}
    )  # fmt: skip
    await sync_config_jobs(client, [yaml_job], "assistant")
    await set_due(client, "cfg", time.time() - 10)  # an occurrence due while the gateway restarts
    assert await sync_config_jobs(client, [yaml_job], "assistant") == 0  # unchanged: left as it is
    assert await client.zscore(G.schedules_due, "cfg") < time.time() * 1000  # still due: it will run
    view = await get_job(client, "cfg")
    assert view is not None and view.spec.target.agent == "assistant" and view.spec.created_by == "config"
    await create_job(client, spec("mine", cron="0 9 * * *"))  # an operator's job made elsewhere stays
    assert await sync_config_jobs(client, [], "assistant") == 1
    assert await get_job(client, "cfg") is None and await get_job(client, "mine") is not None


def _received(channel: str, conversation: str, sender: str, at: float) -> tuple[str, str]:
    return "message_received", json.dumps({"at": at, "kind": "message_received", "channel": channel, "sender": sender})


@pytest.mark.parametrize(
    ("channel", "last_user_s_ago", "template", "delivered", "reason"),
    [
        ("whatsapp", 3600, None, True, ""),  # inside the window
        ("whatsapp", 2 * 86_400, None, False, "outside WhatsApp's 24-hour window"),
        ("whatsapp", None, None, False, "the user never wrote"),
        ("whatsapp", 2 * 86_400, {"name": "daily_digest", "language": "en_US"}, True, ""),
        ("messenger", 2 * 86_400, None, False, "outside messenger's 24-hour messaging window"),
        ("instagram", 3600, None, True, ""),
        ("telegram", None, None, True, ""),  # no window
    ],
)
async def test_platform_windows_are_checked_before_delivery_and_a_skip_says_why(
    client: aioredis.Redis,
    queue_settings: QueueSettings,
    channel: str,
    last_user_s_ago: int | None,
    template: dict[str, str] | None,
    delivered: bool,
    reason: str,
) -> None:
    job = spec("proactive", channel=channel, conversation="4915550001", at=time.time() - 1, template=template)
    session = job_session(job)
    if last_user_s_ago is not None:
        kind, data = _received(channel, "4915550001", "4915550001", time.time() - last_user_s_ago)
        await client.xadd(SessionKeys(session).events, {"kind": kind, "data": data})
    # the gateway's own messages since (an operator's, an earlier job's) do not open the window
    kind, data = _received(channel, "4915550001", "schedule:earlier", time.time() - 60)
    await client.xadd(SessionKeys(session).events, {"kind": kind, "data": data})
    await create_job(client, job)

    await Scheduler(client, queue_settings).tick()

    messages = await inbox(client, session)
    view = await get_job(client, "proactive")
    assert view is not None
    if delivered:
        [message] = messages
        expected = {"window_template": "daily_digest:en_US"} if template and last_user_s_ago else {}
        assert message.conversation.extra == expected
        assert view.last_outcome == "delivered"
    else:
        assert messages == []
        assert view.last_outcome == "skipped" and reason in view.last_reason
        [fact] = [e for e in await events(client, session) if e["kind"] == "schedule_skipped"]
        assert fact["reason"] == "window_closed" and reason in fact["detail"]


async def test_run_now_fires_an_extra_occurrence_and_keeps_the_schedule(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    job = spec("weekly", cron="0 9 * * mon", action="turn", text="summarise the week")
    await create_job(client, job)
    before = await get_job(client, "weekly")
    assert await run_now(client, queue_settings, "weekly") == "delivered"
    [message] = await inbox(client, job_session(job))
    assert isinstance(message.event, Scheduled) and message.event.action == "turn"
    after = await get_job(client, "weekly")
    assert before is not None and after is not None and after.next_at == before.next_at
    with pytest.raises(KeyError):
        await run_now(client, queue_settings, "nope")


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("- {id: a, target: {channel: telegram, conversation: '1', agent: ghost}, action: turn, text: hi, "
         "cron: '0 9 * * *'}", "names agent 'ghost'"),
        ("- {id: a, target: {channel: telegram, conversation: '1'}, action: turn, text: hi, cron: '0 9 * * *'}\n"
         "- {id: a, target: {channel: telegram, conversation: '2'}, action: turn, text: hi, cron: '0 9 * * *'}",
         "the id 'a' is used twice"),
        ("- {id: a, target: {channel: telegram, conversation: '1'}, action: turn, text: hi, cron: 'daily'}",
         "not a five-field cron expression"),
    ],
)  # fmt: skip
def test_the_yaml_schedules_block_is_validated_with_errors_that_say_what_to_fix(
    tmp_path: Path, block: str, message: str
) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text("agents:\n  assistant: {instructions: hi}\nschedules:\n" + textwrap.indent(block, "  ") + "\n")
    with pytest.raises(ConfigError) as caught:
        load_file(config)
    assert message in str(caught.value)


def test_a_valid_yaml_schedules_block_loads(tmp_path: Path) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text(
        "agents:\n  assistant: {instructions: hi}\nschedules:\n"
        "  - {id: digest, target: {channel: telegram, conversation: '1'}, action: turn, text: 'summarise the day',\n"
        "     cron: '0 18 * * *', timezone: Europe/Paris, misfire: skip}\n"
    )
    [job] = load_file(config).schedules
    assert job.id == "digest" and job.misfire == "skip" and job.timezone == "Europe/Paris"
