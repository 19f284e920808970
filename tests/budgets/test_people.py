"""The person registry in real Redis: operator links, one-time codes (expiry, reuse, wrong codes, rate limits)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import yaml

from switchboard.core.events import PersonLinked
from switchboard.core.messages import CommandIssued, ConversationRef, InboundMessage, Sender
from switchboard.errors import ConfigError
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.people import LinkRefused, People
from switchboard.settings import FileConfig
from switchboard.worker.authority import turn_request
from switchboard.worker.budgets import TurnGate, is_direct

TENANT = "default"


async def test_a_code_links_two_accounts_once(async_redis: aioredis.Redis) -> None:
    people = People(async_redis)
    code = await people.issue_code(TENANT, "telegram:42", ttl_s=600, per_hour=5)
    assert code is not None and len(code) == 8 and code.isdigit()
    same = await people.redeem(TENANT, "telegram:42", code, per_hour=5)
    assert isinstance(same, LinkRefused) and "other account" in same.reason  # and the code is spent
    code = await people.issue_code(TENANT, "telegram:42", ttl_s=600, per_hour=5)
    assert code is not None
    linked = await people.redeem(TENANT, "slack:U1", f" {code[:4]}-{code[4:]} ", per_hour=5)  # typed with a dash
    assert isinstance(linked, PersonLinked) and set(linked.principals) == {"telegram:42", "slack:U1"}
    assert await people.person_of(TENANT, "telegram:42") == await people.person_of(TENANT, "slack:U1") == linked.person
    reused = await people.redeem(TENANT, "discord:7", code, per_hour=5)
    assert isinstance(reused, LinkRefused)
    assert await people.person_of(TENANT, "discord:7") is None


async def test_an_expired_code_links_nothing(async_redis: aioredis.Redis) -> None:
    people = People(async_redis)
    code = await people.issue_code(TENANT, "telegram:42", ttl_s=30, per_hour=5)
    assert code is not None
    [key] = await async_redis.keys(GlobalKeys().link_code(TENANT, "*"))
    assert 0 < await async_redis.ttl(key) <= 30
    await async_redis.pexpire(key, 1)  # the code's time passes
    await asyncio.sleep(0.01)
    refused = await people.redeem(TENANT, "slack:U1", code, per_hour=5)
    assert isinstance(refused, LinkRefused) and "expired" in refused.reason
    assert await people.everyone(TENANT) == {}


async def test_wrong_codes_and_code_requests_are_rate_limited(async_redis: aioredis.Redis) -> None:
    people = People(async_redis)
    for _ in range(3):
        assert await people.issue_code(TENANT, "telegram:42", ttl_s=600, per_hour=3) is not None
    assert await people.issue_code(TENANT, "telegram:42", ttl_s=600, per_hour=3) is None
    code = await people.issue_code(TENANT, "telegram:43", ttl_s=600, per_hour=3)
    assert code is not None
    wrong = f"{(int(code) + 1) % 10**8:08d}"
    for _ in range(3):
        refused = await people.redeem(TENANT, "slack:U1", wrong, per_hour=3)
        assert isinstance(refused, LinkRefused) and "wrong" in refused.reason
    blocked = await people.redeem(TENANT, "slack:U1", code, per_hour=3)  # even the right code, once over the limit
    assert isinstance(blocked, LinkRefused) and "Too many" in blocked.reason
    assert await people.everyone(TENANT) == {}
    assert 3590 < await async_redis.ttl(GlobalKeys().link_tries(TENANT, "slack:U1")) <= 3600


async def test_a_principal_of_another_person_is_never_moved(async_redis: aioredis.Redis) -> None:
    people = People(async_redis)
    assert isinstance(await people.link(TENANT, ["telegram:1", "slack:A"], "ann", by="cli"), PersonLinked)
    assert isinstance(await people.link(TENANT, ["telegram:2"], "bob", by="cli"), PersonLinked)
    refused = await people.link(TENANT, ["telegram:3", "telegram:2"], "ann", by="cli")
    assert isinstance(refused, LinkRefused) and "telegram:2 is already linked to bob" in refused.reason
    assert await people.person_of(TENANT, "telegram:3") is None  # all or nothing
    code = await people.issue_code(TENANT, "telegram:1", ttl_s=600, per_hour=5)
    assert code is not None
    crossed = await people.redeem(TENANT, "telegram:2", code, per_hour=5)  # two people's accounts: not merged
    assert isinstance(crossed, LinkRefused)
    assert await people.everyone(TENANT) == {"ann": ["slack:A", "telegram:1"], "bob": ["telegram:2"]}
    assert await people.everyone("other") == {}  # tenants are apart


@pytest.mark.parametrize("person", ["", "Alice", "a b", "x" * 65, "-dash"])
async def test_a_bad_person_id_is_refused(async_redis: aioredis.Redis, person: str) -> None:
    with pytest.raises(ConfigError, match="person id"):
        await People(async_redis).link(TENANT, ["telegram:1"], person, by="cli")
    assert await async_redis.keys("*") == []


def test_the_cli_links_lists_and_unlinks(base_env: dict[str, str], tmp_path: Path) -> None:
    env = base_env | {"PYTHONPATH": os.getcwd()}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "switchboard", "people", *args], env=env, capture_output=True, text=True, timeout=60
        )

    done = cli("link", "telegram:42", "slack:U123", "--as", "alice")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "linked telegram:42 slack:U123 as alice (tenant default)"
    assert cli("list").stdout.strip() == "alice\tslack:U123 telegram:42"
    bad = cli("link", "nobody", "--as", "alice")
    assert bad.returncode == 2 and "write it as <channel>:<sender id>" in bad.stderr
    assert cli("unlink", "telegram:42").stdout.strip() == "unlinked telegram:42 from alice"
    assert cli("unlink", "telegram:42").returncode == 1


@pytest.mark.parametrize(
    ("channel", "meta", "direct"),
    [
        ("telegram", {"chat_type": "private"}, True),
        ("telegram", {"chat_type": "group"}, False),
        ("telegram", {"chat_type": "supergroup"}, False),
        ("telegram", {}, False),
        ("slack", {"channel_type": "im"}, True),
        ("slack", {"channel_type": "channel"}, False),
        ("slack", {"channel_type": "mpim"}, False),
        ("discord", {"dm": True}, True),
        ("discord", {"dm": False, "guild_id": "9"}, False),
        ("discord", {"guild_id": "9"}, False),
        ("teams", {}, False),
        ("web", {}, True),
        ("whatsapp", {}, True),
        ("messenger", {}, True),
        ("instagram", {}, True),
    ],
)
def test_a_link_code_is_given_only_in_a_direct_conversation(
    channel: str, meta: dict[str, object], direct: bool
) -> None:
    message = InboundMessage(
        dedup_key="d",
        conversation=ConversationRef(channel=channel, conversation="c1"),
        sender=Sender(id="u1"),
        text="",
        event=CommandIssued(name="link"),
        meta=meta,
    )
    assert is_direct(message) is direct


GRANTS = """
agents:
  assistant:
    name: assistant
    instructions: test
tenants:
  default:
    policy:
      grants: {"person:alice": ["payments.*"], "telegram:42": ["read.*"]}
identity: {resolve: true}
"""


def _message(channel: str, sender: str) -> InboundMessage:
    return InboundMessage(
        dedup_key=f"{channel}:{sender}",
        conversation=ConversationRef(channel=channel, agent="assistant", conversation=f"c-{sender}"),
        sender=Sender(id=sender),
        text="hello",
    )


@pytest.mark.parametrize(
    ("senders", "person", "permissions"),
    [
        ([("telegram", "42")], "alice", {"read.*", "payments.*"}),  # the person's grants follow them
        ([("slack", "U1")], "alice", {"payments.*"}),  # ... to their other account
        ([("telegram", "43")], "", set()),  # not linked: nothing more
        ([("telegram", "43"), ("telegram", "42")], "alice", set()),  # a batch with another sender's message: no more
    ],
)
async def test_a_linked_persons_turn_carries_the_person_and_its_grants(
    async_redis: aioredis.Redis, senders: list[tuple[str, str]], person: str, permissions: set[str]
) -> None:
    config = FileConfig.model_validate(yaml.safe_load(GRANTS))
    await People(async_redis).link(TENANT, ["telegram:42", "slack:U1"], "alice", by="cli")
    messages = [_message(channel, sender) for channel, sender in senders]
    agent = config.agent("assistant")
    request = turn_request(config, messages[-1].conversation.session_key, agent, messages, "run-1")
    gate = TurnGate.build(async_redis, config)
    assert gate is not None
    ticket = await gate.before(request, messages)
    assert ticket.answer is None
    assert ticket.request.person == person
    assert set(ticket.request.permissions) == permissions


def test_without_budgets_or_identity_there_is_no_gate() -> None:
    assert TurnGate.build(None, FileConfig()) is None  # type: ignore[arg-type]  # nothing to ask Redis
