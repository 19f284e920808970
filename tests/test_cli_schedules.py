"""``switchboard schedules add|list|remove|run-now`` as an operator runs it: a real subprocess, real Redis."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis

from switchboard.core.messages import InboundMessage
from switchboard.core.schedules import occurrence_key
from switchboard.queue.keys import SessionKeys


def sb(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "schedules", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_add_list_run_now_and_remove(base_env: dict[str, str], sync_redis: redis.Redis) -> None:
    added = sb("add", "standup", "--channel", "telegram", "--to", "4242", "--cron", "0 9 * * mon-fri",
               "--timezone", "Europe/Berlin", "--message", "Stand-up in 5 minutes", env=base_env)  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "scheduled standup: next run" in added.stdout

    listed = sb("list", "--json", env=base_env)
    [job] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert job["id"] == "standup" and job["cron"] == "0 9 * * mon-fri" and job["timezone"] == "Europe/Berlin"
    assert job["session"] == "default/assistant/telegram/default/4242" and job["next_at"] > 0

    ran = sb("run-now", "standup", env=base_env)
    assert ran.returncode == 0 and ran.stdout.strip() == "standup: delivered", ran.stderr
    keys = SessionKeys(job["session"])
    [message_id] = sync_redis.lrange(keys.inbox, 0, -1)
    message = InboundMessage.model_validate_json(sync_redis.hget(keys.messages, message_id))  # type: ignore[arg-type]
    assert message.text == "Stand-up in 5 minutes"
    assert message.dedup_key.startswith("schedule:standup:") and message.dedup_key != occurrence_key("standup", 0)

    assert "fired 1" in sb("list", env=base_env).stdout
    assert sb("remove", "standup", env=base_env).returncode == 0
    assert sb("list", env=base_env).stdout.strip() == "no scheduled jobs"
    gone = sb("remove", "standup", env=base_env)
    assert gone.returncode == 1 and "no scheduled job 'standup'" in gone.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "x", "--channel", "telegram", "--to", "1", "--message", "hi"], "--at or --cron"),
        (["add", "x", "--channel", "telegram", "--cron", "0 9 * * *", "--message", "hi"], "--to"),
        (["add", "x", "--channel", "telegram", "--to", "1", "--cron", "0 25 * * *", "--message", "hi"], "cron"),
        (
            [
                "add",
                "x",
                "--channel",
                "telegram",
                "--to",
                "1",
                "--cron",
                "0 9 * * *",
                "--timezone",
                "Nowhere/Land",
                "--message",
                "hi",
            ],
            "unknown time zone",
        ),
        (
            [
                "add",
                "x",
                "--channel",
                "whatsapp",
                "--to",
                "1",
                "--cron",
                "0 9 * * *",
                "--message",
                "hi",
                "--template",
                "Hello World",
            ],
            "template",
        ),
        (["add", "bad id!", "--channel", "telegram", "--to", "1", "--cron", "0 9 * * *", "--message", "hi"], "id"),
        (["add", "x", "--channel", "telegram", "--to", "1", "--at", "2001-01-01T00:00", "--message", "hi"], "past"),
        (["run-now"], "needs a job ID"),
    ],
)
def test_bad_jobs_are_refused_with_a_reason_and_nothing_stored(
    base_env: dict[str, str], sync_redis: redis.Redis, args: list[str], message: str
) -> None:
    result = sb(*args, env=base_env)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert sync_redis.keys("sb:{schedules}*") == []
