"""A whole gateway for the end-to-end benchmarks: Redis, the fake Telegram API, ``switchboard web`` and ONE worker.

Each piece is its own process, started the way an operator starts them (``python -m switchboard web`` /
``worker``), so what is measured is what ships. Messages go in as signed Telegram webhooks; replies are read
back from what the fake Bot API recorded, with the fake's own receive time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench._harness import PYTHON, SECRET_TOKEN, Proc, bench_env, free_port, start_redis
from switchboard.channels.telegram.fake.platform import make_update
from switchboard.queue.embedded import EmbeddedRedis

__all__ = ["HIGH_LIMITS", "Replies", "Stack", "dropped", "gateway"]

HIGH_LIMITS = {
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SESSION_PER_MINUTE": "1000000",
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SENDER_PER_MINUTE": "1000000",
    "SWITCHBOARD_LIMITS__INBOX_DEPTH": "1000000",
}
"""Abuse limits a load test never reaches, yet checked on every message as in production (a limit of 0 would skip
the check and flatter the figures): the defaults (30 messages per session per minute, inbox depth 100) would drop
most of a benchmark's deliberate flood."""


@dataclass
class Stack:
    """The running gateway."""

    redis: EmbeddedRedis
    fake: Proc
    web: Proc
    worker: Proc
    fake_url: str
    web_url: str
    worker_ready_s: float = 0.0
    since: int = 0
    """The fake's last call sequence number already read."""

    async def send(self, http: aiohttp.ClientSession, chat_id: int, update_id: int, text: str) -> float:
        """Post one signed update; returns the time (``time.time()``) the gateway acknowledged it.

        Raises:
            RuntimeError: the gateway did not answer 200.
        """
        update = make_update(text, chat_id=chat_id, update_id=update_id, first_name="Bench", username="bench_user")
        body = json.dumps(update).encode()
        headers = {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": SECRET_TOKEN}
        async with http.post(f"{self.web_url}/webhooks/telegram", data=body, headers=headers) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"the gateway answered {resp.status} to update {update_id}")
        return time.time()


@dataclass
class Replies:
    """Replies the fake recorded, keyed by the token found in their text."""

    pattern: re.Pattern[str]
    seen: dict[str, float] = field(default_factory=dict)
    """Token → the fake's receive time of the first reply carrying it."""
    duplicates: int = 0
    since: int = 0

    async def collect(self, http: aiohttp.ClientSession, fake_url: str, expected: set[str], timeout: float) -> None:
        """Long-poll the fake until every expected token has a reply, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not expected <= self.seen.keys() and time.monotonic() < deadline:
            params = {"since": str(self.since), "method": "sendMessage", "wait": "1"}
            async with http.get(f"{fake_url}/_fake/calls", params=params) as resp:
                calls = await resp.json()
            for call in calls:
                self.since = max(self.since, int(call["seq"]))
                match = self.pattern.search(str(call["params"].get("text", "")))
                if match is None:
                    continue
                token = match.group(0)
                if token in self.seen:
                    self.duplicates += 1
                else:
                    self.seen[token] = float(call["time"])


def dropped(redis_url: str) -> int:
    """Messages the gateway dropped at an abuse limit so far (the deployment-wide ``messages_dropped`` counter)."""
    import redis

    from switchboard.queue.keys import ShardKeys

    client = redis.Redis.from_url(redis_url)
    try:
        with client.pipeline(transaction=False) as pipe:  # the counter is kept per shard
            for shard in ShardKeys.every():
                pipe.hget(shard.stats, "messages_dropped")
            return sum(int(value or 0) for value in pipe.execute())
    finally:
        client.close()


async def _wait_worker(web_url: str, worker: Proc, timeout: float = 30.0) -> float:
    """Wait until ``/healthz`` counts a live worker; returns the seconds since the worker started."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if worker.popen.poll() is not None:
                raise RuntimeError(f"worker exited with {worker.popen.returncode}:\n{worker.tail()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{web_url}/healthz") as resp:
                    if resp.status == 200 and (await resp.json()).get("workers", 0) >= 1:
                        return time.monotonic() - worker.started
            await asyncio.sleep(0.05)
    raise RuntimeError(f"no live worker after {timeout:.0f} s:\n{worker.tail()}")


@contextlib.asynccontextmanager
async def gateway(
    tmp: Path,
    *,
    web_cpus: set[int] | None,
    worker_cpus: set[int] | None,
    worker_env: dict[str, str] | None = None,
    web_env: dict[str, str] | None = None,
    profile_dir: Path | None = None,
) -> AsyncIterator[Stack]:
    """Start Redis, the fake, the web tier (on ``web_cpus``) and one worker (on ``worker_cpus``); stop them after.

    With ``profile_dir``, web and worker run under cProfile and leave ``web.prof`` / ``worker.prof`` there.
    """

    def command(role: str) -> list[str]:
        if profile_dir is None:
            return [PYTHON, "-m", "switchboard", role]
        profile_dir.mkdir(parents=True, exist_ok=True)
        return [PYTHON, "-m", "cProfile", "-o", str(profile_dir / f"{role}.prof"), "-m", "switchboard", role]

    server = start_redis(tmp, web_cpus)
    procs: list[Proc] = []
    try:
        fake_port = free_port()
        fake = Proc(
            "fake-telegram",
            [PYTHON, "-m", "bench._servers", "fake-telegram", "--port", str(fake_port)],
            cpus=web_cpus,
            log_dir=tmp,
        )
        procs.append(fake)
        fake_url = f"http://127.0.0.1:{fake_port}"
        fake.wait_http(f"{fake_url}/_fake/calls")
        port = free_port()
        env = bench_env(server.url, tmp / "data", port=port, telegram_url=fake_url)
        web = Proc("web", command("web"), env={**env, **(web_env or {})}, cpus=web_cpus, log_dir=tmp)
        procs.append(web)
        web_url = f"http://127.0.0.1:{port}"
        web.wait_http(f"{web_url}/healthz")
        worker = Proc("worker", command("worker"), env={**env, **(worker_env or {})}, cpus=worker_cpus, log_dir=tmp)
        procs.append(worker)
        ready = await _wait_worker(web_url, worker)
        yield Stack(server, fake, web, worker, fake_url, web_url, ready)
    finally:
        for proc in reversed(procs):
            proc.stop()
        server.stop()
