"""Pairing end to end: a stranger gets a code through Telegram's real webhook path, the operator approves it with the
CLI (a subprocess), and the stranger's next message is answered by a real worker process; expiry, reminders and
revocation on the same path."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
import yaml
from aiohttp.test_utils import TestClient

from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update, sign_update
from switchboard.core.events import EventAdapter
from switchboard.queue.access import PairingStore
from switchboard.queue.keys import GlobalKeys
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from switchboard.web.appkeys import ROUTER
from tests.conftest import MINIMAL_CONFIG

SECRET = "webhook_secret-123"
STRANGER = 5150
_KEYS = GlobalKeys()


def sb(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    server = FakeTelegram(token="42:test")
    await server.start()
    yield server
    await server.stop()


def _env(base_env: dict[str, str], fake: FakeTelegram, tmp_path: Path, access: dict[str, Any]) -> dict[str, str]:
    data = yaml.safe_load(MINIMAL_CONFIG)
    data["channels"] = {"telegram": {"access": {"mode": "pairing", **access}}}
    config = tmp_path / "pairing.yaml"
    config.write_text(yaml.safe_dump(data))
    return base_env | {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_MODEL": "offline",
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:test",
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake.base_url,
    }


class Chat:
    """The stranger's side: posts signed updates through the web app, reads what the bot sent them."""

    def __init__(self, client: TestClient, fake: FakeTelegram, r: redis.Redis) -> None:
        self.client, self.fake, self.redis = client, fake, r
        self.update = 1000

    async def say(self, text: str) -> None:
        self.update += 1
        body, headers = sign_update(make_update(text, chat_id=STRANGER, update_id=self.update), SECRET)
        resp = await self.client.post("/webhooks/telegram", data=body, headers=headers)
        assert resp.status == 200
        gate = self.client.app[ROUTER].gate
        assert gate is not None
        await gate.drain()

    def received(self) -> list[str]:
        return [str(c.params.get("text", "")) for c in self.fake.sent(STRANGER)]

    def queued(self) -> int:
        return sum(int(self.redis.llen(key)) for key in self.redis.keys("sb:*:inbox"))

    def code(self) -> str:
        [text] = [t for t in self.received() if "pairing code is" in t][-1:]
        return text.split("pairing code is ")[1][:7]

    def events(self, kind: str) -> list[Any]:
        found = []
        for key in self.redis.keys("sb:*:events"):
            for _, fields in self.redis.xrange(key):
                if fields[b"kind"].decode() == kind:
                    found.append(EventAdapter.validate_json(fields[b"data"]))
        return found


@pytest.fixture
async def chat_for(
    base_env: dict[str, str], fake: FakeTelegram, tmp_path: Path, aiohttp_client: Any, sync_redis: redis.Redis
) -> Any:
    async def make(**access: Any) -> tuple[Chat, dict[str, str]]:
        env = _env(base_env, fake, tmp_path, access)
        client = await aiohttp_client(create_app(load_settings(env), listeners=False))
        return Chat(client, fake, sync_redis), env

    return make


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_code_issued_then_cli_approve_then_the_next_message_is_answered(
    chat_for: Any, workers: list[subprocess.Popen[bytes]]
) -> None:
    chat, env = await chat_for()
    await chat.say("hello?")
    assert chat.queued() == 0
    [answer] = chat.received()
    assert "This bot is private" in answer and "(valid 1 hour)" in answer
    code = chat.code()

    listed = await asyncio.to_thread(sb, "access", "list", env=env)
    assert listed.returncode == 0 and f"waiting\ttelegram:{STRANGER}" in listed.stdout
    wrong = await asyncio.to_thread(sb, "access", "approve", "AAA-AAA", env=env)
    assert wrong.returncode == 1 and "no live pairing code" in wrong.stderr
    approved = await asyncio.to_thread(
        sb, "access", "approve", code.lower().replace("-", " "), "--operator", "ada", env=env
    )
    assert approved.returncode == 0, approved.stderr
    assert f"paired telegram:{STRANGER}" in approved.stdout
    again = await asyncio.to_thread(sb, "access", "approve", code, env=env)
    assert again.returncode == 1, "a code pairs once"

    workers.append(subprocess.Popen([sys.executable, "-m", "switchboard", "worker"], env=env))
    await chat.say("now?")
    deadline = time.monotonic() + 30
    while len(chat.received()) < 2:
        assert time.monotonic() < deadline, "the paired sender's message was not answered"
        await asyncio.sleep(0.1)
    assert "now?" in chat.received()[-1]  # the offline model repeats the message
    [paired] = chat.events("access_paired")
    assert paired.principal == f"telegram:{STRANGER}" and paired.operator == "console:ada"
    [received] = chat.events("message_received")
    assert (received.access, received.role) == ("paired", "user")
    listed = await asyncio.to_thread(sb, "access", "list", env=env)
    assert f"paired\ttelegram:{STRANGER}\tdefault" in listed.stdout


async def test_an_expired_code_is_refused_and_the_sender_gets_a_new_one(chat_for: Any) -> None:
    chat, env = await chat_for()
    await chat.say("hello?")
    old = chat.code()
    for key in [
        *chat.redis.keys("sb:{access:default}:code:*"),
        _KEYS.access_pending("default", f"telegram:{STRANGER}"),
    ]:
        chat.redis.pexpire(key, 1)  # the code's hour, passed
    await asyncio.sleep(0.05)
    refused = await asyncio.to_thread(sb, "access", "approve", old, env=env)
    assert refused.returncode == 1
    await chat.say("still there?")
    assert chat.queued() == 0
    assert chat.code() != old and len(chat.events("pairing_code_issued")) == 2


async def test_the_refusal_answer_is_rate_limited_and_repeats_no_code(chat_for: Any) -> None:
    chat, _ = await chat_for()
    for text in ("a", "b", "c"):
        await chat.say(text)
    assert len(chat.received()) == 1 and len(chat.events("pairing_code_issued")) == 1
    chat.redis.delete(_KEYS.access_notice("default", f"telegram:{STRANGER}"))  # the notice interval passed
    await chat.say("d")
    assert len(chat.received()) == 2
    assert "sent earlier" in chat.received()[-1] and "pairing code is" not in chat.received()[-1]
    assert len(chat.events("pairing_code_issued")) == 1, "at most one live code per sender"
    assert chat.queued() == 0


async def test_revocation_bites_within_recheck_s(chat_for: Any, async_redis: aioredis.Redis) -> None:
    chat_redis = async_redis
    chat, env = await chat_for(pairing={"recheck_s": 0.5})
    await chat.say("hello?")
    assert (await asyncio.to_thread(sb, "access", "approve", chat.code(), "--role", "admin", env=env)).returncode == 0
    await chat.say("in")
    assert chat.queued() == 1
    assert chat.events("message_received")[0].role == "admin"
    assert await PairingStore(chat_redis).revoke("default", f"telegram:{STRANGER}", "console:ada")
    assert len(chat.events("access_revoked")) == 1
    await chat.say("cached")  # this process found the sender paired under half a second ago
    assert chat.queued() == 2
    await asyncio.sleep(0.6)
    await chat.say("out")
    assert chat.queued() == 2, "a revoked sender is refused once recheck_s has passed"
    assert (await asyncio.to_thread(sb, "access", "revoke", f"telegram:{STRANGER}", env=env)).returncode == 1
